"""Checkpoints name their run: what names it, and a device that keeps ``--checkpoint-dir``
across runs starts the next run fresh instead of resuming the last one."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from airgossip.coordinator.client import RunInfo
from airgossip.node.command import AgentCommand, check_command
from airgossip.node.options import AgentProcessOptions
from airgossip.node.process import run_identity
from airgossip.scenario.config import ConfigError, load_config
from tests.support.local_fleet import LocalFleet

PEERS = {"agent-0": "127.0.0.1:5000", "agent-1": "127.0.0.1:5001"}


def static(run_id: str | None = None, peers: dict[str, str] = PEERS) -> AgentProcessOptions:
    return AgentProcessOptions(agent_id="agent-0", index=0, peers=peers, run_id=run_id)


def test_what_names_the_run_of_a_checkpoint() -> None:
    config = load_config(None, {"agents": 2, "rounds": 30, "seed": 1})
    run = RunInfo("20260101-120000-ab12", None, 2, 30, None, 0, 0, False)
    assert run_identity(run, config, static()) == "20260101-120000-ab12"
    # Static peers: the run the operator names, else a digest of scenario and peer list.
    assert run_identity(None, config, static("trial-7")) == "trial-7"
    digest = run_identity(None, config, static())
    assert digest.startswith("static-") and digest == run_identity(None, config, static())
    other_seed = load_config(None, {"agents": 2, "rounds": 30, "seed": 2})
    assert run_identity(None, other_seed, static()) != digest
    moved = {**PEERS, "agent-1": "10.0.0.2:5001"}
    assert run_identity(None, config, static(peers=moved)) != digest
    # A setting each agent makes for itself (its device) is not the run's.
    on_cpu = config.model_copy(update={"device": "cpu"})
    assert run_identity(None, on_cpu, static()) == digest


def test_run_id_is_for_static_peers_only(tmp_path: Path) -> None:
    peers = tmp_path / "peers.toml"
    with pytest.raises(ConfigError, match="the coordinator names the run"):
        check_command(AgentCommand(coordinator="h:1", insecure=True, run_id="r1"))
    with pytest.raises(ConfigError, match="--run-id"):
        check_command(AgentCommand(peers=peers, config=peers, insecure=True, run_id="a b"))
    check_command(AgentCommand(peers=peers, config=peers, insecure=True, run_id="trial-7"))
    assert AgentCommand(run_id="trial-7").argv() == ["--run-id", "trial-7"]


CONSENSUS = """\
agents = 2
rounds = 30
seed = 4
wait_timeout_s = 0.25
[task]
name = "consensus"
dim = 8
"""


@pytest.fixture
def fleets() -> Iterator[list[LocalFleet]]:
    made: list[LocalFleet] = []
    yield made
    for fleet in made:
        fleet.close()


def start(folder: Path, fleets: list[LocalFleet]) -> LocalFleet:
    folder.mkdir()
    fleet = LocalFleet(
        folder, agents=2, topology=["--topology", "ring"], scenario=CONSENSUS,
        checkpoint_interval_s=0.2,
    )  # fmt: skip
    fleets.append(fleet)
    fleet.start_coordinator()
    return fleet


@pytest.mark.slow
def test_a_device_that_keeps_its_checkpoints_starts_the_next_run_fresh(
    tmp_path: Path, fleets: list[LocalFleet]
) -> None:
    first = start(tmp_path / "first", fleets)
    for index in range(2):
        first.start_agent(index)
    first.wait(lambda: min(first.round_of(i) for i in range(2)) >= 30, 240, "the first run")
    kept = tmp_path / "first" / "checkpoints" / "agent-0"
    # A run shorter than the checkpoint interval leaves only the checkpoint written after its
    # last round is reported: wait for it before the agents are killed.
    first.wait(lambda: list(kept.glob("*.ckpt")), 60, "agent-0's last checkpoint")
    first.close()

    # The same task, fleet (CA) and agent, another coordinator run: its folder is kept.
    second = start(tmp_path / "second", fleets)
    shutil.copytree(kept, tmp_path / "second" / "checkpoints" / "agent-0")
    for index in range(2):
        second.start_agent(index)
    second.wait(lambda: min(second.round_of(i) for i in range(2)) >= 30, 240, "the second run")
    log = (second.logs / "agent-0.log").read_text(errors="replace")
    refused = [line for line in log.splitlines() if " refused: it is of run " in line]
    assert refused, second.log_tail("agent-0.log", 40)
    assert "starting fresh" in log and "resumed round" not in log
    # It ran the second run from its start, not from the first run's last round.
    rounds = [r.round for r in second.records(0)]
    assert rounds[0] == 0 and rounds[-1] == 30
