"""Flower apps on the mesh, Flower's own FedAvg beside them, and ``airgossip compare``.

Real parts throughout: agents are OS processes gossiping over real gRPC with 10% message
loss; the baseline is Flower's simulation engine (Ray) running the app's own ServerApp. The
output folders of the example's runs are shared by the tests of this module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import ROOT, airgossip, assert_one_line_error, cli
from tests.support.processes import processes_mentioning

EXAMPLE = str(ROOT / "examples" / "flower-digits")
#: What Flower and Ray start; none of it may outlive a run.
FLOWER_PROCESSES = ("raylet", "gcs_server", "ray::", "flower_simulation", "flower-superlink",
                    "flower-superexec", "flwr-simulation")  # fmt: skip


def leftovers(out: Path) -> list[int]:
    return [pid for text in (*FLOWER_PROCESSES, str(out)) for pid in processes_mentioning(text)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flower-runs")


@pytest.mark.slow
def test_the_example_app_learns_peer_to_peer_over_lossy_grpc(runs: Path) -> None:
    out = runs / "mesh"
    result = airgossip("run", "--flower-app", EXAMPLE, "--agents", "4", "--loss", "0.1",
                       "--out", str(out), timeout=400)  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["mode"] == "process" and results["config"]["rounds"] == 20
    assert results["config"]["task"]["app"] == EXAMPLE
    final = results["final"]
    assert final["complete"] and final["mean_accuracy"] >= 0.85, final
    assert final["messages_dropped"] > 0  # the links did lose messages
    assert (out / "results.png").exists()
    assert not leftovers(out)


@pytest.mark.slow
def test_a_legacy_numpy_client_app_learns_too(tmp_path: Path) -> None:
    out = tmp_path / "legacy"
    result = airgossip("run", "--flower-app", "examples.flower_legacy_client:app",
                       "--agents", "4", "--loss", "0.1", "--rounds", "20",
                       "--run-config", "lr=0.1", "--out", str(out), timeout=400)  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    final = json.loads((out / "results.json").read_text())["final"]
    assert final["complete"] and final["mean_accuracy"] >= 0.85, final
    log = (out / "logs" / "agent-0.log").read_text()
    assert log.count("NumPyClient") <= 1  # Flower's per-call deprecation warning, once
    assert not leftovers(out)


@pytest.mark.slow
def test_a_bare_message_api_client_app_by_module_attr_learns(tmp_path: Path) -> None:
    # Hand-written: a ClientApp object in a module, no project folder, no ServerApp; its
    # own query reply is the initial model.
    out = tmp_path / "bare"
    result = airgossip("run", "--flower-app", "tests.edge.flower_apps:bare_digits",
                       "--agents", "4", "--loss", "0.1", "--rounds", "20",
                       "--out", str(out), timeout=400)  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    final = json.loads((out / "results.json").read_text())["final"]
    assert final["complete"] and final["mean_accuracy"] >= 0.9, final
    print(f"\nbare ClientApp: mean accuracy {final['mean_accuracy']:.3f}")
    assert not leftovers(out)


def test_server_app_flag_names_the_serverapp_of_a_bare_client_app(tmp_path: Path) -> None:
    out = tmp_path / "named"
    result = airgossip("run", "--flower-app", "tests.edge.flower_apps:recording",
                       "--server-app", "tests.edge.flower_apps:server", "--mode", "inproc",
                       "--agents", "2", "--rounds", "2", "--run-config", "scale=2",
                       "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    config = json.loads((out / "results.json").read_text())["config"]
    assert config["task"]["server_app"] == "tests.edge.flower_apps:server"
    assert config["rounds"] == 2


@pytest.mark.slow
def test_the_example_under_flowers_own_fedavg_then_compared(runs: Path) -> None:
    out = runs / "fedavg"
    result = airgossip("baseline", "flower", EXAMPLE, "--agents", "4", "--out", str(out),
                       timeout=500)  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["baseline"] == "flower"
    assert results["config"]["server_app"] == "flowerdigits.server_app:app"
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 21))
    assert all(r["agents_reporting"] == 4 for r in rounds)
    # FedAvg's round: the model to 4 nodes and back, and to 4 nodes for evaluation (4,874
    # float32 parameters), plus the 4 evaluate replies.
    assert rounds[0]["messages_sent"] == 4 * 4
    assert 3 * 4 * 4874 * 4 < rounds[0]["bytes_sent"] < 4 * 4 * 4874 * 4
    sent = [r["messages_sent"] for r in rounds]
    assert sent == sorted(sent) and sent[-1] >= 19 * 4 * 4, sent
    assert results["final"]["mean_accuracy"] >= 0.85
    assert results["versions"]["flwr"].startswith("1.")
    assert not leftovers(out), "Flower or Ray processes outlived the baseline"
    assert not list((out / "flower-home").glob("apps/*"))  # nothing installed

    mesh = runs / "mesh"
    if not (mesh / "results.json").exists():
        pytest.skip("the peer-to-peer run of this module did not run")
    plot = runs / "compare.png"
    compared = airgossip("compare", str(mesh), str(out), "--out", str(plot), timeout=120)
    assert compared.returncode == 0, compared.stderr
    assert "mesh: airgossip push-sum · exponential · 4 agents · loss 0.1 · process" in (
        compared.stdout
    )
    assert "fedavg: Flower flowerdigits.server_app:app · 4 nodes" in compared.stdout
    assert plot.stat().st_size > 10_000


def test_a_failing_app_stops_the_fleet_with_one_line(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text(
        '[task]\nname = "flower"\napp = "tests.edge.flower_apps:wrong_shape"\n'
        'server_app = "tests.edge.flower_apps:server"\n'
    )
    out = tmp_path / "run"
    result = airgossip("run", "--config", str(scenario), "--agents", "2", "--out", str(out),
                       timeout=240)  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "flower app 'tests.edge.flower_apps:wrong_shape' on agent-" in lines[0]
    assert "array 'w' of shape (2, 3), the model's is (3, 2)" in lines[0]
    assert not leftovers(out)


def test_a_failing_app_in_process_gets_the_same_line(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text(
        '[task]\nname = "flower"\napp = "tests.edge.flower_apps:raises"\n'
        'server_app = "tests.edge.flower_apps:server"\n'
    )
    result = cli("run", "--config", str(scenario), "--agents", "2", "--mode", "inproc",
                 "--out", str(tmp_path / "run"))  # fmt: skip
    assert result.returncode == 1
    assert "flower app 'tests.edge.flower_apps:raises' on agent-0: its train handler raised " \
           "RuntimeError: out of memory on the device" in result.stderr  # fmt: skip


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--flower-app", "no/such/app"], ["'no/such/app' is neither a folder nor module:attr"]),
        (["--flower-app", EXAMPLE, "--task", "digits"], ["either --task or --flower-app"]),
        (["--flower-app", EXAMPLE, "--run-config", "epochs=3"], ["no key 'epochs'"]),
        (["--flower-app", EXAMPLE, "--run-config", "lr=="],
         ["--run-config", "invalid format", "key1=123"]),
        (["--accuracy-metric", "acc"], ["--accuracy-metric apply to a Flower app"]),
        (["--server-app", "tests.edge.flower_apps:server"], ["--server-app apply to a Flower app"]),
        (["--flower-app", "tests.edge.flower_apps:recording", "--server-app", "server"],
         ["--server-app must be module:attr of a ServerApp"]),
        (["--flower-app", "tests.edge.flower_apps:recording"],
         ["no ServerApp and no query handler", "--server-app"]),
        (["--flower-app", "examples.flower_legacy_client:app", "--run-config", "lr=oops"],
         ["--run-config"]),
    ],
)  # fmt: skip
def test_bad_flower_flags_get_one_line_errors(
    args: list[str], fragments: list[str], tmp_path: Path
) -> None:
    result = cli("run", "--out", str(tmp_path / "out"), "--mode", "inproc", *args)
    assert_one_line_error(result, *fragments)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["baseline", "flower", "examples.flower_legacy_client:app"],
         ["the baseline runs the app's own ServerApp"]),
        (["baseline", "flower", EXAMPLE, "--agents", "0"], ["agents must be at least 1"]),
        (["baseline", "flower", EXAMPLE, "--run-config", "nope=1"], ["no key 'nope'"]),
        (["compare", "no-such-run"], ["does not exist"]),
        (["compare", ".", "--target", "2"], ["--target"]),
    ],
)  # fmt: skip
def test_bad_baseline_and_compare_input(args: list[str], fragments: list[str]) -> None:
    assert_one_line_error(cli(*args), *fragments)


def test_a_flower_app_on_a_wireless_scenario_with_compressed_gossip(tmp_path: Path) -> None:
    out = tmp_path / "wireless"
    result = cli("run", "--flower-app", EXAMPLE, "--scenario", "wifi-indoor", "--agents", "4",
                 "--mode", "virtual", "--rounds", "8", "--algorithm", "quantized-push-sum",
                 "--compression", "qsgd:4", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["compression"] == "qsgd:4" and "wireless" in results
    assert results["final"]["complete"] and results["final"]["mean_accuracy"] >= 0.8
