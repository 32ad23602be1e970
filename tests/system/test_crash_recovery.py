"""kill -9 of a quarter of a fleet mid-run, restarted with the same command.

Real processes over real gRPC with mutual TLS: a coordinator and eight agents, each keeping
checkpoints every half second. Two agents are killed with SIGKILL mid-run (whatever they did since
their last checkpoint is lost) and started again on their checkpoint folder. Each starts every edge
over (airgossip.edge.agent.lineage). Restarted from their newest checkpoints late in a consensus
run, the fleet still reaches the exact average (agents that agree lose nothing that moves it).
Restarted on digits from a checkpoint written long before (the newer ones gone, as when the writer
lags) and from no checkpoint at all, no value anywhere turns non-finite, the coordinator writes
results, and the fleet ends as accurate as an undisturbed run with the same seed.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from airgossip.edge.tasks.consensus import ConsensusOptions, true_average
from tests.support.local_fleet import LocalFleet

pytestmark = pytest.mark.slow

AGENTS, VICTIMS = 8, (2, 5)
CONSENSUS = """\
agents = 8
rounds = {rounds}
seed = 4
wait_timeout_s = 0.25
[task]
name = "consensus"
dim = 16
[network]
loss = 0.1
"""
DIGITS = """\
agents = 8
rounds = {rounds}
seed = 4
eval_every = 5
wait_timeout_s = 0.25
[task]
name = "digits"
local_steps = 5
[network]
loss = 0.1
"""


@pytest.fixture
def fleets() -> Iterator[list[LocalFleet]]:
    made: list[LocalFleet] = []
    yield made
    for fleet in made:
        fleet.close()


def resumed_round(fleet: LocalFleet, index: int) -> int:
    """The round the agent's log says it resumed from."""
    found = re.findall(r"resumed round (\d+) from", fleet.log_tail(f"agent-{index}.log", 400))
    assert found, fleet.log_tail(f"agent-{index}.log")
    return int(found[-1])


def run(
    tmp: Path,
    scenario: str,
    rounds: int,
    fleets: list[LocalFleet],
    *,
    kill_at: int | None,
    old_checkpoint_at: int | None = None,
) -> LocalFleet:
    """Run a fleet to its last round; with ``kill_at``, SIGKILL the victims once everyone has
    reached that round and start them again two seconds later. With ``old_checkpoint_at``,
    the first victim restarts from the checkpoint it had written by that round (its newer
    ones removed) and the second from no checkpoint at all."""
    tmp.mkdir()
    fleet = LocalFleet(
        tmp, agents=AGENTS, topology=["--topology", "exponential"],
        scenario=scenario.format(rounds=rounds), checkpoint_interval_s=0.5,
        # The victims are back long before this: never declared dead, so the run does not
        # end (survivors finished, victims dead) while a loaded machine restarts them.
        heartbeat_timeout_s=60.0,
    )  # fmt: skip
    fleets.append(fleet)
    fleet.start_coordinator()
    everyone = range(AGENTS)
    for i in everyone:
        fleet.start_agent(i)
    folders = {i: tmp / "checkpoints" / f"agent-{i}" for i in VICTIMS}
    if old_checkpoint_at is not None:
        fleet.wait(lambda: fleet.round_of(VICTIMS[0]) >= old_checkpoint_at and any(
            folders[VICTIMS[0]].glob("*.ckpt")), 300, f"round {old_checkpoint_at}")  # fmt: skip
        shutil.copytree(folders[VICTIMS[0]], tmp / "old-checkpoints")
    if kill_at is not None:
        fleet.wait(lambda: all(fleet.round_of(i) >= kill_at for i in everyone), 300,
                   f"every agent to reach round {kill_at}")  # fmt: skip
        for i in VICTIMS:
            fleet.kill_agent(i)
        lost = {i: fleet.round_of(i) for i in VICTIMS}  # the last round each reported
        if old_checkpoint_at is not None:
            shutil.rmtree(folders[VICTIMS[0]])
            shutil.copytree(tmp / "old-checkpoints", folders[VICTIMS[0]])
            shutil.rmtree(folders[VICTIMS[1]])
        time.sleep(2.0)
        for i in VICTIMS:
            fleet.start_agent(i)
    if kill_at is not None and old_checkpoint_at is None:
        resumed = fleet.wait(
            lambda: all(fleet.records(i) for i in VICTIMS) and {i: resumed_round(fleet, i)
                                                                for i in VICTIMS},
            120, "the victims to report again",
        )  # fmt: skip
        print(f"killed at rounds {lost}; resumed from checkpoints at rounds {resumed}")
        # from a checkpoint, not from scratch (digits reports every 5th round only)
        assert all(0 < resumed[i] < lost[i] + 5 for i in VICTIMS), (lost, resumed)
    fleet.wait(
        lambda: all((r := fleet.latest(i)) is not None and r.final for i in everyone),
        600, "every agent to finish",
    )  # fmt: skip
    return fleet


def assert_finite_everywhere(fleet: LocalFleet) -> None:
    """No refusal of a non-finite payload or report in any log, every record finite."""
    for log in fleet.logs.glob("*.log"):
        text = log.read_text(errors="replace")
        assert "NaN or infinit" not in text, f"{log.name}:\n{fleet.log_tail(log.name, 30)}"
    for i in range(AGENTS):
        for record in fleet.records(i):
            values = [*record.metrics.values(), *record.scalars.values()]
            assert all(math.isfinite(v) for v in values), (i, record.round, record.metrics)


@pytest.mark.timeout(900)
def test_consensus_is_exact_after_a_quarter_of_the_fleet_is_killed_and_resumed(
    fleets: list[LocalFleet], tmp_path: Path
) -> None:
    fleet = run(tmp_path / "consensus", CONSENSUS, 600, fleets, kill_at=120)
    target = true_average(4, AGENTS, ConsensusOptions(dim=16)).numpy()
    errors = []
    for i in range(AGENTS):
        final = fleet.latest(i)
        assert final is not None and final.estimate is not None
        errors.append(float(np.linalg.norm(final.estimate - target) / np.linalg.norm(target)))
    print(f"relative error per agent after kill -9 and resume: {max(errors):.3g} (max)")
    assert max(errors) < 1e-6, errors


@pytest.mark.timeout(900)
def test_digits_after_kill_and_resume_matches_an_undisturbed_run(
    fleets: list[LocalFleet], tmp_path: Path
) -> None:
    def accuracy(fleet: LocalFleet) -> float:
        finals = [fleet.latest(i) for i in range(AGENTS)]
        return float(np.mean([r.metrics["accuracy"] for r in finals if r is not None]))

    undisturbed = accuracy(run(tmp_path / "undisturbed", DIGITS, 60, fleets, kill_at=None))
    fleets.pop().close()
    fleet = run(tmp_path / "disturbed", DIGITS, 60, fleets, kill_at=30, old_checkpoint_at=5)
    disturbed = accuracy(fleet)
    rejoined = re.findall(r"rejoining the fleet at round (\d+)", fleet.log_tail("agent-5.log", 400))
    print(f"digits mean accuracy: undisturbed {undisturbed:.4f}, one agent restarted from a "
          f"checkpoint of round <= 5 and one from none at round 30: {disturbed:.4f} "
          f"(the second rejoined at round {rejoined})")  # fmt: skip
    assert_finite_everywhere(fleet)
    written = fleet.wait(lambda: (fleet.results_dir / "results.json").exists(), 60, "results")
    assert written
    results = json.loads((fleet.results_dir / "results.json").read_text())
    assert results["final"]["mean_accuracy"] >= 0.9
    assert disturbed >= 0.9 and abs(disturbed - undisturbed) <= 0.02
