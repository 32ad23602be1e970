"""The command line: clear one-line errors, and a run that writes its results."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.support.cli import airgossip, assert_one_line_error, cli


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ["--topology", "star"],
            ["unknown topology 'star'", "exponential", "one-peer-exponential"],
        ),
        (["--task", "mnist"], ["unknown task 'mnist'", "digits", "consensus", "module:callable"]),
        (["--algorithm", "fedavg"], ["unknown algorithm 'fedavg'", "push-sum-plain"]),
        (["--loss", "2"], ["network.loss"]),
        (["--mode", "cloud"], ["unknown mode 'cloud'", "process, inproc, virtual, namespaces"]),
        (["--agents", "0"], ["agents"]),
        (["--device", "tpu"], ["device"]),
        (["--coordinator-port", "70000"], ["coordinator-port"]),
    ],
)
def test_bad_flags_get_one_line_errors(
    args: list[str], fragments: list[str], tmp_path: Path
) -> None:
    result = cli("run", "--out", str(tmp_path / "out"), *args)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "out" / "results.json").exists()


def test_bad_scenario_files(tmp_path: Path) -> None:
    missing = airgossip("run", "--config", str(tmp_path / "nope.toml"), timeout=60)  # real process
    assert_one_line_error(missing, "nope.toml does not exist")
    broken = tmp_path / "broken.toml"
    broken.write_text("agents = 4\ntopology = [unclosed\n")
    assert_one_line_error(cli("run", "--config", str(broken)), "not valid TOML", "line 2")
    typo = tmp_path / "typo.toml"
    typo.write_text("agents = 4\n[network]\nlos = 0.2\n")
    assert_one_line_error(cli("run", "--config", str(typo)), "unknown setting 'network.los'")
    wrong_type = tmp_path / "type.toml"
    wrong_type.write_text('rounds = "ten"\n')
    assert_one_line_error(cli("run", "--config", str(wrong_type)), "rounds")


def test_an_output_folder_that_holds_a_run_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "agents").mkdir(parents=True)
    (out / "results.json").write_text("{}")
    result = cli("run", "--mode", "inproc", "--rounds", "1", "--out", str(out))
    assert_one_line_error(result, str(out), "already holds a run", "results.json", "--out")
    assert (out / "results.json").read_text() == "{}"  # the earlier run is left alone


def test_busy_coordinator_port(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = airgossip("run", "--agents", "2", "--coordinator-port", str(port),
                           "--out", str(tmp_path), timeout=60)  # fmt: skip
    assert_one_line_error(result, f"127.0.0.1:{port}", "--coordinator-port")


def test_agent_needs_a_coordinator_or_peers() -> None:
    assert_one_line_error(cli("agent"), "--coordinator", "--peers")


def test_scenario_file_and_flags_override_it(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        'agents = 3\nrounds = 50\nmode = "inproc"\ntopology = "ring"\n'
        '[task]\nname = "consensus"\ndim = 4\n[network]\nloss = 0.2\n'
    )
    out = tmp_path / "o"
    result = cli("run", "--config", str(scenario), "--rounds", "6", "--out", str(out))
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    config = results["config"]
    assert (config["agents"], config["rounds"], config["topology"]) == (3, 6, "ring")
    assert config["network"]["loss"] == 0.2 and config["task"]["dim"] == 4
    assert results["final"]["round"] == 6
    assert "relative error" in result.stdout
    assert (tmp_path / "o" / "results.png").exists()


def test_topology_command() -> None:
    result = cli("topology", "exponential", "--agents", "16")
    assert result.returncode == 0
    assert "|λ2| = 0.6000" in result.stdout and "directed" in result.stdout
    assert_one_line_error(cli("topology", "hypercube"), "unknown topology")


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--topology", "star"], ["unknown topology 'star'", "k-out", "one-peer-exponential"]),
        (["--metrics-port", "70000"], ["--metrics-port", "0..65535"]),
        (["--out-degree", "0"], ["--out-degree"]),
        (["--heartbeat-interval-s", "2", "--heartbeat-timeout-s", "3"], ["at least twice"]),
        (["--agents", "0"], ["agents"]),
        (["--listen", "127.0.0.1:http"], ["cannot listen on 127.0.0.1:http"]),
    ],
)
def test_bad_coordinator_flags_get_one_line_errors(args: list[str], fragments: list[str]) -> None:
    result = cli("coordinator", "--insecure", "--listen", "127.0.0.1:0", *args)
    assert_one_line_error(result, *fragments)


def test_coordinator_refuses_busy_ports_and_unusable_databases(tmp_path: Path) -> None:
    base = ["coordinator", "--insecure", "--listen", "127.0.0.1:0", "--metrics-port", "0"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        busy = cli("coordinator", "--insecure", "--listen", f"127.0.0.1:{port}")
        assert_one_line_error(busy, f"cannot listen on 127.0.0.1:{port}", "in use")
        busy_metrics = cli(
            "coordinator", "--insecure", "--listen", "127.0.0.1:0", "--metrics-port", str(port)
        )
        assert_one_line_error(busy_metrics, f"127.0.0.1:{port}", "in use")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    assert_one_line_error(cli(*base, "--db", str(shared / "fleet.db")), "writable by every user")
    # One page of a real database overwritten (a disk that went bad): one line, no traceback.
    from airgossip.coordinator.policy import TopologySpec
    from airgossip.coordinator.store import FleetStore

    damaged = tmp_path / "state" / "damaged.db"
    store = FleetStore(damaged)
    store.claim(TopologySpec("ring").describe(), 8)
    store.database.query("CREATE TABLE filler (x TEXT)")
    for _ in range(20):
        store.database.query("INSERT INTO filler VALUES (?)", ("x" * 2000,))
    store.close()
    data = bytearray(damaged.read_bytes())
    data[4096:8192] = b"\x5a" * 4096
    damaged.write_bytes(bytes(data))
    assert_one_line_error(cli(*base, "--db", str(damaged)), "damaged.db is damaged", "backup")
    junk = tmp_path / "junk.db"
    junk.write_text("not a database " * 100)
    assert_one_line_error(cli(*base, "--db", str(junk)), "junk.db", "not a database")
    store = FleetStore(tmp_path / "ring.db")
    store.claim(TopologySpec("ring").describe(), 8)
    store.close()
    other = cli(*base, "--db", str(tmp_path / "ring.db"), "--topology", "k-out")
    assert_one_line_error(other, "holds a fleet of 8 agents", "ring", "another --db")


def test_agent_refuses_a_busy_metrics_port(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = airgossip(
            "agent", "--insecure", "--coordinator", "127.0.0.1:1",
            "--metrics-listen", f"127.0.0.1:{port}", "--ready-timeout-s", "5", timeout=120,
        )  # fmt: skip
    assert_one_line_error(result, f"cannot serve metrics on 127.0.0.1:{port}", "in use")


def test_plaintext_is_only_ever_explicit() -> None:
    for command in (["agent", "--coordinator", "127.0.0.1:1"], ["coordinator"]):
        assert_one_line_error(cli(*command), "--certs DIR", "--insecure")


def test_certificates_are_made_and_checked_with_one_line_errors(tmp_path: Path) -> None:
    folder = tmp_path / "ca"
    assert cli("certs", "init", "--dir", str(folder)).returncode == 0
    assert cli("certs", "issue", "coordinator", "--dir", str(folder)).returncode == 0
    assert_one_line_error(cli("certs", "init", "--dir", str(folder)), "already exists")
    assert_one_line_error(cli("certs", "issue", "a b", "--dir", str(folder)), "identity")
    assert_one_line_error(cli("certs", "issue", "x", "--dir", str(tmp_path)), "certs init")
    result = airgossip(
        "agent", "--coordinator", "127.0.0.1:1", "--certs", str(folder), "--id", "agent-7",
        "--ready-timeout-s", "5", timeout=120,
    )  # fmt: skip
    assert_one_line_error(result, "agent-7.pem does not exist")
