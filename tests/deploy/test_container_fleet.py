"""``airgossip run --mode containers``: one Docker container per agent, each shaping its own
links in the kernel, ending with results.json like every mode; containers and the network
removed at the end (also on Ctrl-C). Each agent container sees only its own certificate and
key (mutual TLS). Without NET_ADMIN the agents say so and shape their links themselves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airgossip.emulation.fleets.containers import DockerEngine
from tests.deploy.conftest import Engine
from tests.support.cli import ROOT, airgossip, assert_tcp_carried_every_message

pytestmark = pytest.mark.slow


# On a Docker host shared with other people, other container fleets (label airgossip.run)
# come and go during a test: a test checks and removes only the fleet it started, found by
# what its containers mount of the test's own run folder.


def fleet_tags(engine: Engine, out: Path) -> set[str]:
    """The tags (label ``airgossip.run``) of the fleets whose containers mount part of the
    run folder ``out``: the fleet this test started, and no one else's."""
    containers = engine.run("ps", "-aq", "--filter", "label=airgossip.run").split()
    if not containers:
        return set()
    fields = '{{index .Config.Labels "airgossip.run"}}{{range .Mounts}} {{.Source}}{{end}}'
    listed = engine.run("inspect", "--format", fields, *containers, check=False).splitlines()
    run = str(out.resolve())
    return {
        tag for tag, *sources in (line.split() for line in listed if line.strip())
        if any(source == run or source.startswith(f"{run}/") for source in sources)
    }  # fmt: skip


def of_fleet(engine: Engine, tags: set[str]) -> list[str]:
    """Containers and networks of the fleets ``tags``."""
    found: list[str] = []
    for tag in sorted(tags):
        where = f"label=airgossip.run={tag}"
        found += engine.run("ps", "-aq", "--filter", where).split()
        found += engine.run("network", "ls", "-q", "--filter", where).split()
    return found


def remove_fleet(engine: Engine, tags: set[str]) -> None:
    """Remove the containers and networks of the fleets ``tags`` (and nothing else)."""
    for tag in sorted(tags):
        where = f"label=airgossip.run={tag}"
        if containers := engine.run("ps", "-aq", "--filter", where).split():
            engine.run("rm", "-f", *containers, check=False)
        if networks := engine.run("network", "ls", "-q", "--filter", where).split():
            engine.run("network", "rm", *networks, check=False)


def left_by_run(engine: Engine, out: Path, networks_before: list[str]) -> list[str]:
    """What a finished run left: containers mounting its folder, and fleet networks made
    since ``networks_before`` that no container uses (a fleet removes its network with its
    last container; another fleet's network has its containers)."""
    left = [*of_fleet(engine, fleet_tags(engine, out))]
    for network in engine.run("network", "ls", "-q", "--filter", "label=airgossip.run").split():
        if network in networks_before:
            continue
        attached = engine.run(
            "network", "inspect", "--format", "{{len .Containers}}", network, check=False
        )  # fmt: skip
        if attached == "0":
            left.append(network)
    return left


def fleet_networks(engine: Engine) -> list[str]:
    """The networks of every container fleet on the engine now (to compare with later)."""
    return engine.run("network", "ls", "-q", "--filter", "label=airgossip.run").split()


@pytest.mark.timeout(900)
def test_eight_agents_in_containers_end_with_results(
    engine: Engine, image: str, tmp_path: Path
) -> None:
    before = fleet_networks(engine)
    out = tmp_path / "run"
    result = airgossip("run", "--mode", "containers", "--agents", "8", "--out", str(out),
                       timeout=800)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["mode"] == "containers"
    assert results["final"]["round"] == 40 and results["final"]["complete"]
    assert results["final"]["mean_accuracy"] >= 0.9
    assert (out / "results.png").stat().st_size > 0
    assert sorted(p.name for p in (out / "agents").glob("*.jsonl")) == [
        f"agent-{i}.jsonl" for i in range(8)
    ]
    # Every agent shaped its links in the kernel: 10% of packets dropped at the receivers.
    kernel = json.loads((out / "kernel.json").read_text())
    assert kernel["agents_shaping_in_kernel"] == 8 and not kernel["fallback"]
    seen = sum(link["packets_seen"] for link in kernel["links"])
    dropped = sum(link["packets_dropped"] for link in kernel["links"])
    assert seen > 2000
    assert dropped / seen == pytest.approx(0.1, rel=0.2)
    # No message was dropped by an in-agent shaper: TCP carried them through the drops.
    assert_tcp_carried_every_message(out, results)
    assert not left_by_run(engine, out, before), "containers or networks left behind"


@pytest.mark.timeout(900)
def test_four_containers_send_what_four_processes_send_and_show_packet_drops_apart(
    engine: Engine, image: str, tmp_path: Path
) -> None:
    fleet = ("--agents", "4", "--rounds", "15", "--seed", "0", "--loss", "0.1")
    sent, outputs = {}, {}
    for mode in ("process", "containers"):
        out = tmp_path / mode
        result = airgossip("run", "--mode", mode, *fleet, "--out", str(out), timeout=800)
        assert result.returncode == 0, result.stdout + result.stderr
        outputs[mode] = result.stdout
        sent[mode] = json.loads((out / "results.json").read_text())["final"]["messages_sent"]
    assert sent["process"] == 4 * 15 * 2
    assert abs(sent["containers"] - sent["process"]) <= 0.05 * sent["process"], sent
    results = json.loads((tmp_path / "containers" / "results.json").read_text())
    links = json.loads((tmp_path / "containers" / "kernel.json").read_text())["links"]
    seen = sum(link["packets_seen"] for link in links)
    dropped = sum(link["packets_dropped"] for link in links)
    assert results["kernel"]["packets_seen"] == seen > 0
    assert results["kernel"]["packets_dropped"] == dropped > 0
    summary = " ".join(line.strip() for line in outputs["containers"].splitlines())
    assert f"the kernel dropped {dropped:,} of {seen:,} packets" in summary, summary
    print(
        f"\nmessages: process {sent['process']}, containers {sent['containers']}; kernel "
        f"dropped {dropped} of {seen} packets"
    )


@pytest.mark.timeout(600)
def test_containers_switch_graphs_through_their_coordinator(
    engine: Engine, image: str, tmp_path: Path
) -> None:
    """A [switching] schedule in containers: the embedded coordinator switches the graph
    from the agents' round reports (as in process mode) and push-sum stays exact."""
    scenario = tmp_path / "switching.toml"
    scenario.write_text(
        'agents = 4\nrounds = 60\ntopology = "complete"\neval_every = 1\n\n'
        '[task]\nname = "consensus"\ndim = 30\n\n[network]\nloss = 0.0\nlatency_ms = 50\n\n'
        '[switching]\ntopologies = ["complete", "ring"]\nat_rounds = [6]\n'
    )
    out = tmp_path / "run"
    result = airgossip("run", "--mode", "containers", "--config", str(scenario),
                       "--out", str(out), timeout=500)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["switched_at"] == [6]
    assert results["final"]["complete"] and results["final"]["round"] == 60
    assert results["final"]["relative_error"] < 1e-6


@pytest.mark.timeout(300)
def test_without_net_admin_agents_shape_links_themselves_and_ctrl_c_removes_everything(
    engine: Engine, image: str, tmp_path: Path
) -> None:
    """One fleet for two checks (each fleet start costs torch imports in every container):
    agents without NET_ADMIN say so and shape their links themselves; Ctrl-C stops them,
    writes partial results and removes containers and network."""
    tags: set[str] = set()
    scenario = tmp_path / "no-net-admin.toml"
    scenario.write_text(
        'agents = 3\nrounds = 100000\ntopology = "complete"\n\n'
        "[network]\nloss = 0.3\n\n[containers]\nnet_admin = false\n"
    )
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "airgossip", "run", "--mode", "containers",
         "--config", str(scenario), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and launcher.poll() is None:
            records = list((out / "agents").glob("*.jsonl")) if out.exists() else []
            if len(records) == 3 and all(len(p.read_text().splitlines()) > 5 for p in records):
                break
            time.sleep(1)
        assert launcher.poll() is None, launcher.communicate()
        tags = fleet_tags(engine, out)
        assert len(tags) == 1, tags  # the fleet's containers and network
        # Mutual TLS: each container sees the CA's certificate and its own pair, read-only,
        # and nothing else of the run's certs/ folder.
        running = engine.run("ps", "-q", "--filter", f"label=airgossip.run={min(tags)}").split()
        assert len(running) == 3
        for container in running:
            agent_id = engine.run("inspect", "--format", "{{.Name}}", container).split("-", 2)[2]
            mounts = json.loads(engine.run("inspect", "--format", "{{json .Mounts}}", container))
            run_certs = str(out.resolve() / "certs")
            certs = {m["Destination"]: m for m in mounts if m["Source"].startswith(run_certs)}
            own = (f"{agent_id}.key", f"{agent_id}.pem", "ca.pem")
            assert sorted(certs) == [f"/airgossip/certs/{name}" for name in own]
            assert not any(m["RW"] for m in certs.values())
            assert str(out.resolve()) not in {m["Source"] for m in mounts}
        launcher.send_signal(signal.SIGINT)
        _, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            # A killed launcher cleans nothing up: remove what this fleet started, so a
            # failed check does not leave three agents training on the machine.
            remove_fleet(engine, tags or fleet_tags(engine, out))
    assert launcher.returncode == 130, stderr
    assert "interrupted" in stderr
    assert (out / "certs" / "ca.pem").is_file()  # the run's throwaway authority
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] is True
    assert not of_fleet(engine, tags), "containers or networks left behind"
    kernel = json.loads((out / "kernel.json").read_text())
    assert kernel["agents_shaping_in_kernel"] == 0
    assert all("NET_ADMIN" in reason for reason in kernel["fallback"].values())
    for log in (out / "logs").glob("*.log"):
        assert "shaping them in the agent instead" in log.read_text()
    # The agents' own shaper lost messages at the configured rate.
    assert results["final"]["messages_dropped"] > 0


def test_a_missing_image_is_refused_before_anything_starts(engine: Engine, tmp_path: Path) -> None:
    scenario = tmp_path / "missing.toml"
    scenario.write_text('[containers]\nimage = "airgossip-no-such-image:0"\n')
    result = airgossip("run", "--mode", "containers", "--config", str(scenario),
                       "--out", str(tmp_path / "run"))  # fmt: skip
    assert result.returncode == 2
    assert "image 'airgossip-no-such-image:0' not found" in result.stderr
    assert not (tmp_path / "run").exists()
    assert DockerEngine(engine.docker).unavailable("airgossip-no-such-image:0") is not None
