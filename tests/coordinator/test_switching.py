"""A [switching] schedule followed by the coordinator on a fake clock, fed round reports by
hand: the epoch goes up when every agent has passed the round, old peers are kept, an
adaptive trigger reads the reported estimates, and a restarted coordinator keeps its stage."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from airgossip.common.topology import (
    TopologyError,
    TopologySwitcher,
    fleet_figures,
    parse_switching,
)
from airgossip.coordinator.membership import LivenessSettings, Membership
from airgossip.coordinator.policy import SwitchingPolicy, TopologySpec, make_policy
from airgossip.coordinator.store import FleetStore, StoreError
from airgossip.edge.observability.stats import RoundRecord
from tests.support.agents import FakeClock

LIVENESS = LivenessSettings(heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0)
AGENTS = [f"agent-{i}" for i in range(6)]
BY_ROUND = {"topologies": ["complete", "ring"], "at_rounds": [6]}


def make_fleet(
    schedule: dict[str, Any] | None, clock: FakeClock, db: Path | None = None
) -> Membership:
    spec = TopologySpec("complete")
    switcher = TopologySwitcher(parse_switching(schedule), 6) if schedule is not None else None
    return Membership(
        expected=6, spec=spec, policy=make_policy(spec, switcher), store=FleetStore(db),
        liveness=LIVENESS, clock=clock, wall=clock,
    )  # fmt: skip


def register_all(fleet: Membership) -> None:
    for i, agent_id in enumerate(AGENTS):
        fleet.register(agent_id, f"10.0.0.{i}:7000", "digest", estimate_length=4)


def record(agent_id: str, round_index: int, spread: float = 1.0) -> RoundRecord:
    """A consensus-like report: estimates ``spread`` apart around 10, a loss that falls."""
    offset = spread * (int(agent_id.split("-")[1]) - 2.5)
    estimate = np.full(4, 10.0 + offset)
    return RoundRecord(agent_id, round_index, 0.1 * round_index, {"loss": 1.0 / round_index},
                       estimate=estimate)  # fmt: skip


def report_round(
    fleet: Membership, round_index: int, agents: list[str] = AGENTS, **kw: Any
) -> None:
    for agent_id in agents:
        fleet.report(agent_id, [record(agent_id, round_index, **kw)])


def graph_name(fleet: Membership) -> str:
    graph = fleet.graphs.graph
    return graph.graph.name if graph is not None else ""


def out_neighbours(fleet: Membership, agent_id: str) -> set[str]:
    return {p for phase in fleet.assignments[agent_id].schedule for p in phase.out_weights}


def test_the_epoch_goes_up_once_every_agent_has_passed_the_round_and_old_peers_stay() -> None:
    clock = FakeClock()
    fleet = make_fleet(BY_ROUND, clock)
    register_all(fleet)
    assert fleet.epoch == 1 and out_neighbours(fleet, "agent-0") == set(AGENTS[1:])
    for round_index in range(1, 5):
        report_round(fleet, round_index)
    # Agents run on at their own pace: three are far ahead (a batch of rounds in one report),
    # the others have not passed round 5 yet.
    for agent_id in AGENTS[:3]:
        fleet.report(agent_id, [record(agent_id, r) for r in range(5, 9)])
    report_round(fleet, 5, AGENTS[3:5])
    assert fleet.epoch == 1 and fleet.graphs.next_observed == 5
    report_round(fleet, 5, ["agent-5"])
    assert fleet.epoch == 2
    switcher = fleet.policy.switcher
    assert switcher is not None and switcher.switched_at == [6] and switcher.finished
    assert {a.epoch for a in fleet.assignments.values()} == {2}
    # The ring from round 6 on, every old peer still in the directory (what the complete
    # graph's edges still owe must arrive).
    assert out_neighbours(fleet, "agent-0") == {"agent-1", "agent-5"}
    assert set(fleet.assignments["agent-0"].peers) == set(AGENTS[1:])
    assert graph_name(fleet) == "ring"
    for round_index in range(6, 12):  # (the three ahead reported up to 8 already)
        report_round(fleet, round_index, AGENTS[3:] if round_index <= 8 else AGENTS)
    assert fleet.epoch == 2  # the schedule is done: no more epochs


def test_a_dead_agent_does_not_hold_the_schedule_up() -> None:
    clock = FakeClock()
    fleet = make_fleet(BY_ROUND, clock)
    register_all(fleet)
    clock.now += 4.0
    for round_index in range(1, 6):
        report_round(fleet, round_index, AGENTS[:5])
    assert fleet.epoch == 1  # agent-5 is alive and has not reported
    clock.now += 1.5  # agent-5 silent past the timeout; the others just reported
    assert fleet.expire() == ["agent-5"]
    assert fleet.epoch == 2 and fleet.graphs.graph is not None and graph_name(fleet) == "complete"
    report_round(fleet, 6, AGENTS[:5])  # the next report moves the schedule on
    assert fleet.epoch == 3 and graph_name(fleet) == "ring"
    # The ring over six agents with agent-5 spliced out: agent-4 -> agent-0 closes it.
    assert out_neighbours(fleet, "agent-4") == {"agent-3", "agent-0"}
    assert "agent-5" not in fleet.assignments


def test_an_adaptive_trigger_reads_the_reported_estimates() -> None:
    schedule = {"topologies": ["complete", "ring", "exponential"],
                "trigger": "consensus-distance-below", "threshold": 0.05, "window": 2}  # fmt: skip
    clock = FakeClock()
    fleet = make_fleet(schedule, clock)
    register_all(fleet)
    spreads = {1: 1.0, 2: 0.5, 3: 0.01, 4: 0.5, 5: 0.01, 6: 0.01, 7: 0.01}
    for round_index in range(1, 6):
        report_round(fleet, round_index, spread=spreads[round_index])
    assert fleet.epoch == 1  # round 3 alone was below (window 2); round 4 broke the streak
    # Round 6: one agent reports no estimate (a round it does not evaluate): no figure, and
    # no switch, though the five it has agree.
    for agent_id in AGENTS:
        late = record(agent_id, 6, spread=0.01)
        fleet.report(agent_id, [replace(late, estimate=None) if agent_id == "agent-0" else late])
    assert fleet.epoch == 1
    report_round(fleet, 7, spread=spreads[7])
    switcher = fleet.policy.switcher
    assert switcher is not None and switcher.switched_at == [8]
    assert fleet.epoch == 2 and fleet.graphs.graph is not None and graph_name(fleet) == "ring"
    # The figure it read is the shared one (what a fleet in one process measures).
    figures = fleet_figures(5, [record(a, 5, spread=0.01) for a in AGENTS], 6)
    assert figures.consensus_distance is not None and figures.consensus_distance < 0.05
    assert figures.loss == pytest.approx(0.2)


def test_a_restarted_coordinator_keeps_the_stage_and_the_adaptive_streak(tmp_path: Path) -> None:
    schedule = {"topologies": ["complete", "ring", "exponential"],
                "trigger": "consensus-distance-below", "threshold": 0.05, "window": 3}  # fmt: skip
    db = tmp_path / "fleet.db"
    clock = FakeClock()
    fleet = make_fleet(schedule, clock, db)
    register_all(fleet)
    for round_index in range(1, 4):
        report_round(fleet, round_index, spread=0.01)
    assert fleet.epoch == 2  # three agreeing rounds: the ring from round 4
    report_round(fleet, 4, spread=0.01)
    report_round(fleet, 5, spread=0.01)  # two of the three rounds the next switch needs
    fleet.store.close()

    restarted = make_fleet(schedule, clock, db)
    assert restarted.restored and restarted.epoch == 2
    assert graph_name(restarted) == "ring"
    switcher = restarted.policy.switcher
    assert switcher is not None and switcher.stage == 1 and switcher.switched_at == [4]
    assert restarted.graphs.next_observed == 4  # rounds 4 and 5 are told again from the store
    report_round(restarted, 6, spread=0.01)
    assert switcher.switched_at == [4, 7] and restarted.epoch == 3
    assert graph_name(restarted) == "exponential"
    # A repair after the restart stays on the schedule's graph.
    clock.now += 10.0
    for agent_id in AGENTS[:5]:
        restarted.heartbeat(agent_id, None, 3)
    clock.now += 0.1
    restarted.expire()
    assert graph_name(restarted) == "exponential" and "agent-5" not in restarted.assignments
    restarted.store.close()


def test_a_database_of_another_schedule_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    clock = FakeClock()
    fleet = make_fleet(BY_ROUND, clock, db)
    register_all(fleet)
    fleet.store.close()
    with pytest.raises(StoreError, match="holds a fleet of 6 agents on topology"):
        make_fleet(None, clock, db)
    other = {"topologies": ["complete", "ring"], "at_rounds": [9]}
    with pytest.raises(StoreError, match="start with the same settings or another --db"):
        make_fleet(other, clock, db)


def test_the_schedule_must_start_on_the_coordinators_topology() -> None:
    switcher = TopologySwitcher(parse_switching(BY_ROUND), 6)
    with pytest.raises(TopologyError, match="first topology of \\[switching\\], 'complete'"):
        make_policy(TopologySpec("ring"), switcher)
    assert isinstance(make_policy(TopologySpec("complete"), switcher), SwitchingPolicy)
