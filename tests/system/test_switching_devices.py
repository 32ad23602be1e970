"""A [switching] schedule on agents started by hand: the coordinator started with the
scenario switches the graph from the agents' round reports, and the run's results say at
which round. Real OS processes over real gRPC and mutual TLS, as on devices."""

from __future__ import annotations

from pathlib import Path

import pytest

from airgossip.common.identity import agent_ids
from airgossip.common.security.certificates import throwaway_fleet
from airgossip.scenario.results import RunResults
from tests.support.cli import airgossip, assert_one_line_error
from tests.support.processes import free_port
from tests.system.test_device_fleet import spawn

SCENARIO = """agents = 4
rounds = 60
[task]
name = "consensus"
dim = 8
[network]
loss = 0.1
latency_ms = 20
[switching]
topologies = ["complete", "ring"]
at_rounds = [6]
"""


@pytest.mark.slow  # five processes that each import torch
@pytest.mark.timeout(300)
def test_a_coordinator_started_by_hand_switches_its_agents(tmp_path: Path) -> None:
    coordinator_dir = tmp_path / "coordinator"
    coordinator_dir.mkdir()
    (coordinator_dir / "scenario.toml").write_text(SCENARIO)
    certs = throwaway_fleet(tmp_path / "certs", ["coordinator", *agent_ids(4)])
    port = free_port()
    coordinator = spawn(
        ["coordinator", "--listen", f"127.0.0.1:{port}", "--metrics-port", "0",
         "--config", "scenario.toml", "--certs", str(certs),
         # Reports come with heartbeats: a short interval brings the switch sooner.
         "--heartbeat-interval-s", "0.5", "--heartbeat-timeout-s", "3"],
        coordinator_dir,
    )  # fmt: skip
    device = ["agent", "--coordinator", f"127.0.0.1:{port}", "--certs", str(certs),
              "--linger-s", "120", "--index"]  # fmt: skip
    agents = [spawn([*device, str(i)], tmp_path / f"device-{i}") for i in range(4)]
    try:
        outputs = [agent.communicate(timeout=240)[0] for agent in agents]
        coordinator_output = coordinator.communicate(timeout=60)[0]
    finally:
        for process in (coordinator, *agents):
            process.kill()
    for agent, output in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, output
    assert coordinator.returncode == 0, coordinator_output
    assert "complete → ring · emulated loss 0.1" in coordinator_output
    assert "epoch 2 ([switching]: ring from round 6)" in coordinator_output
    (out,) = list((coordinator_dir / "runs").iterdir())
    results = RunResults.read(out / "results.json")
    assert results.config["switched_at"] == [6] and results.config["mode"] == "devices"
    final = results.final
    assert final.complete and final.agents_reporting == 4
    assert final.relative_error is not None and final.relative_error < 1e-6


def test_k_out_and_a_schedule_are_refused_together(tmp_path: Path) -> None:
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    result = airgossip(
        "coordinator", "--config", "scenario.toml", "--topology", "k-out", "--insecure",
        "--listen", f"127.0.0.1:{free_port()}", "--metrics-port", "0", cwd=tmp_path,
    )  # fmt: skip
    assert_one_line_error(result, "k-out is the coordinator's own graph")
