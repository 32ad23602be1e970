"""kill -9 of a quarter of a fleet mid-run, restarted from their checkpoints.

Real processes over real gRPC with mutual TLS: a coordinator and eight agents, each keeping
checkpoints every half second. Two agents are killed with SIGKILL mid-run (whatever they did
since their last checkpoint is lost) and started again on the same checkpoint folder; they
resume from it. The fleet's push-sum mass must be conserved: consensus still reaches the
exact average, and digits ends as accurate as an undisturbed run with the same seed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edge.tasks.consensus import ConsensusOptions, true_average
from tests.support import LocalFleet

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
    tmp: Path, scenario: str, rounds: int, fleets: list[LocalFleet], *, kill_at: int | None
) -> LocalFleet:
    """Run a fleet to its last round; with ``kill_at``, SIGKILL the victims once everyone has
    reached that round and start them again two seconds later."""
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
    if kill_at is not None:
        fleet.wait(lambda: all(fleet.round_of(i) >= kill_at for i in everyone), 300,
                   f"every agent to reach round {kill_at}")  # fmt: skip
        for i in VICTIMS:
            fleet.kill_agent(i)
        lost = {i: fleet.round_of(i) for i in VICTIMS}  # the last round each reported
        time.sleep(2.0)
        for i in VICTIMS:
            fleet.start_agent(i)
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
    disturbed = accuracy(run(tmp_path / "disturbed", DIGITS, 60, fleets, kill_at=20))
    print(f"digits mean accuracy: undisturbed {undisturbed:.4f}, kill -9 + resume {disturbed:.4f}")
    assert abs(disturbed - undisturbed) <= 0.01
