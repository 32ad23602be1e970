"""Agents started by hand, as on separate devices, make one run like ``airgossip run``'s.

Every process runs in its own working directory with nothing but what a device would be
given: the coordinator's address, the token and its index. ``PYTHONPATH`` points the
processes at this checkout and ``OMP_NUM_THREADS=1`` keeps four agents from fighting over
two cores; neither is an agent setting.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import airgossip.edge.agent.waiting as waiting
from airgossip.common.identity import agent_ids
from airgossip.common.security.certificates import throwaway_fleet
from airgossip.common.topology import Assignment, Phase
from airgossip.coordinator.client import CoordinatorClient
from airgossip.coordinator.policy import TopologySpec
from airgossip.coordinator.run import RunSpec
from airgossip.coordinator.service import CoordinatorServer
from airgossip.node.peers import wait_for_peers
from airgossip.scenario.config import load_config
from airgossip.scenario.results import RunResults
from tests.support.cli import ROOT, airgossip, assert_one_line_error
from tests.support.processes import free_port

ENV = {
    **os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
    "PYTHONFAULTHANDLER": "1",  # a process that hangs dumps its threads on SIGABRT
}  # fmt: skip


def spawn(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "airgossip", *args], cwd=cwd, env=ENV, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.slow  # five processes that each import torch: 23 s on an idle 2-core machine
@pytest.mark.timeout(300)
def test_agents_started_by_hand_are_one_run_with_results(tmp_path: Path) -> None:
    coordinator_dir = tmp_path / "coordinator"
    coordinator_dir.mkdir()
    # The fleet's scenario lives with the coordinator only; it says nothing of the links.
    (coordinator_dir / "scenario.toml").write_text(
        'agents = 4\nrounds = 40\n[task]\nname = "consensus"\ndim = 8\n'
    )
    # Mutual TLS as on devices: one authority, a certificate per member.
    certs = throwaway_fleet(tmp_path / "certs", ["coordinator", *agent_ids(4)])
    port = free_port()
    coordinator = spawn(
        ["coordinator", "--listen", f"127.0.0.1:{port}", "--metrics-port", "0",
         "--token", "s3cret", "--config", "scenario.toml", "--certs", str(certs),
         # A short timeout: an agent declared dead for finishing would be within the run.
         "--heartbeat-interval-s", "0.5", "--heartbeat-timeout-s", "3"],
        coordinator_dir,
    )  # fmt: skip
    device = ["agent", "--coordinator", f"127.0.0.1:{port}", "--token", "s3cret",
              "--certs", str(certs),
              # Each serves until the run is complete: on a loaded machine the slowest
              # agent may finish more than the default 10 s after the fastest.
              "--linger-s", "120", "--index"]  # fmt: skip
    agents = [spawn([*device, str(i)], tmp_path / f"device-{i}") for i in range(4)]
    try:
        outputs = [agent.communicate(timeout=240)[0] for agent in agents]
        coordinator_output = coordinator.communicate(timeout=60)[0]
    finally:
        for process in (coordinator, *agents):
            process.kill()
    for i, (agent, output) in enumerate(zip(agents, outputs, strict=True)):
        assert agent.returncode == 0, output
        assert "4 agents, 40 rounds, task consensus, push-sum, real links" in output
        assert f"agent-{i} finished 40 rounds" in output and "is complete; leaving" in output
    assert coordinator.returncode == 0, coordinator_output
    assert "declared dead" not in coordinator_output
    assert "4 finished" in coordinator_output  # the summary, on the coordinator's console

    run_dirs = list((coordinator_dir / "runs").iterdir())
    assert len(run_dirs) == 1
    out = run_dirs[0]
    results = RunResults.read(out / "results.json")  # the schema of airgossip run's results
    assert results.run is not None and results.run.id == out.name
    assert results.run.agents == {f"agent-{i}": "finished" for i in range(4)}
    assert results.config["network"]["loss"] == 0.0 and results.config["mode"] == "devices"
    final = results.final
    assert final.complete and final.agents_reporting == 4 and final.round == 40
    # Real links: nothing emulated drops a message (a push that reaches an agent before its
    # own neighbour list does is refused, and counts as lost, but it is no emulated loss).
    assert results.run.messages_emulated_drops == 0
    assert final.messages_dropped == results.run.messages_failed
    assert final.messages_sent > 4 * 40
    assert final.relative_error is not None and final.relative_error < 1e-6
    assert [r.round for r in results.rounds] == list(range(41))
    assert (out / "results.png").stat().st_size > 10_000
    summary = (out / "summary.txt").read_text()
    assert f"{final.messages_sent} sent, {final.messages_dropped} lost" in summary
    assert "0 dropped by emulated links" in summary and "real links" in summary
    assert max(len(line) for line in summary.splitlines()) <= 80


@pytest.mark.parametrize(
    ("scenario", "named"),
    [
        ("agents = 16\n", "agents = 16 here, 4 in the fleet"),
        ('[task]\nname = "consensus"\n', "task.name = 'consensus' here, 'digits' in the fleet"),
        ('algorithm = "dpsgd"\n', "algorithm = 'dpsgd' here, 'push-sum' in the fleet"),
    ],
)
def test_an_agent_that_disagrees_with_the_fleet_is_refused_naming_the_setting(
    scenario: str, named: str, tmp_path: Path
) -> None:
    fleet = load_config(None, {"agents": 4}, real_links=True)
    server = CoordinatorServer(
        expected=4, topology=TopologySpec("exponential"), token="t",
        run=RunSpec(scenario=fleet.model_dump(mode="json"), rounds=fleet.rounds),
    )  # fmt: skip
    address = server.start()
    try:
        (tmp_path / "mine.toml").write_text(scenario)
        result = airgossip(
            "agent", "--coordinator", address, "--token", "t", "--index", "0", "--insecure",
            "--config", str(tmp_path / "mine.toml"), timeout=120, cwd=tmp_path,
        )  # fmt: skip
        assert_one_line_error(result, "FAILED_PRECONDITION", named)
        assert server.view().members == ()  # refused before it registered
    finally:
        server.stop(grace_s=0)


def test_an_agent_says_what_it_waits_for_and_leaves_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()  # nobody listens there
    agent = spawn(
        ["agent", "--coordinator", f"127.0.0.1:{port}", "--index", "1", "--insecure"], tmp_path
    )
    lines: list[str] = []
    try:
        assert agent.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = agent.stdout.readline()
            lines.append(line)
            if "waiting for" in line or not line:
                break
        waiting = lines[-1]
        assert f"agent-1 waiting for the run from the coordinator at 127.0.0.1:{port}" in waiting
        assert "since" in waiting and "UNAVAILABLE" in waiting and "next in" in waiting
        agent.send_signal(signal.SIGINT)
        rest, _ = agent.communicate(timeout=30)
    finally:
        agent.kill()
    assert agent.returncode == 0, "".join(lines) + rest
    assert "stopped while waiting for the coordinator" in rest
    assert "Traceback" not in "".join(lines) + rest


def stopped_output(process: subprocess.Popen[str], timeout_s: float) -> str:
    """What ``process`` printed until it exited; where it has not exited in ``timeout_s``,
    fail with its signal state and every thread's stack (faulthandler, on SIGABRT)."""
    try:
        return process.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        status = Path(f"/proc/{process.pid}/status").read_text()
        signals = [line for line in status.splitlines() if line.startswith(("Sig", "Shd"))]
        process.send_signal(signal.SIGABRT)
        try:
            dump = process.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            process.kill()
            dump = process.communicate()[0] + "\n(no dump: killed)"
        pytest.fail(
            f"not stopped in {timeout_s:g} s; {signals}; parent's mask "
            f"{signal.pthread_sigmask(signal.SIG_BLOCK, [])}; output:\n{dump}"
        )


def test_a_coordinator_restarted_on_its_database_keeps_the_run(tmp_path: Path) -> None:
    """The run id, and a wireless scenario's t = 0, survive a restart on the same --db."""
    scenario = ROOT / "airgossip" / "scenario" / "presets" / "wifi-indoor.toml"
    args = [
        "coordinator", "--listen", f"127.0.0.1:{free_port()}", "--metrics-port", "0",
        "--db", str(tmp_path / "fleet.db"), "--config", str(scenario), "--agents", "4",
        "--insecure",
    ]  # fmt: skip
    heads = []
    for _ in range(2):
        coordinator = spawn(args, tmp_path)
        assert coordinator.stdout is not None
        lines = [coordinator.stdout.readline()]
        while lines[-1] and not lines[-1].startswith("agents need only"):
            lines.append(coordinator.stdout.readline())
        heads.append(next(line for line in lines if line.startswith("coordinator on")))
        coordinator.send_signal(signal.SIGTERM)
        # Within the stop's own bounds (handlers' wait, then the exit deadline), never a hang.
        rest = stopped_output(coordinator, timeout_s=90)
        assert coordinator.returncode == 130, heads[-1] + rest  # stopped, as run's Ctrl-C
        assert "nothing written" in rest
        assert "still running" not in rest and "still stopping" not in rest, rest
    run_ids = [re.search(r"run (\S+):", head) for head in heads]
    assert all(run_ids), heads
    assert "(new fleet)" in heads[0] and "(restored from" in heads[1]
    assert run_ids[0].group(1) == run_ids[1].group(1)  # type: ignore[union-attr]


def test_an_agent_says_how_full_the_fleet_is_and_which_peers_do_not_answer(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiting, "WAIT_REPORT_S", 0.3)
    server = CoordinatorServer(expected=3, topology=TopologySpec("ring"))
    server.start()
    client = CoordinatorClient(server.address, "agent-0")
    try:
        client.register("127.0.0.1:7000", "digest")
        with caplog.at_level(logging.INFO, logger="airgossip.agent"):
            assert not client.wait_ready(lambda: False, 1.0)
            silent = f"127.0.0.1:{free_port()}"
            phase = Phase(0.5, {"agent-1": 0.5}, ("agent-1",))
            assignment = Assignment(1, {"agent-0": "x", "agent-1": silent}, (phase,))
            wait_for_peers("agent-0", assignment, 1.5, threading.Event())
    finally:
        client.close()
        server.stop(grace_s=0)
    lines = [r.getMessage() for r in caplog.records]
    assert any("agent-0 waiting for the fleet to fill since" in line
               and "1 of 3 agents registered" in line for line in lines), lines  # fmt: skip
    peers = f"1 of 1 not answering yet: agent-1 ({silent})"
    assert any("agent-0 waiting for its peers since" in line and peers in line for line in lines)
    assert any("starting without hearing from: agent-1" in line for line in lines)
