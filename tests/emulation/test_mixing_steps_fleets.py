"""Several gossip steps per local step in every driver: lock step, the virtual clock and agent
processes over real gRPC. A one-peer exponential graph's whole period in one round is the
exact average; under loss push-sum stays exact at any number of steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airgossip.emulation.fleets import run_fleet
from airgossip.emulation.fleets.batched import batched_refusal
from airgossip.emulation.fleets.virtual_fast import fast_refusal
from airgossip.emulation.networks import network_for
from airgossip.scenario.config import load_config, read_scenario
from airgossip.scenario.wireless import scenario_path

#: Agents 8, one-peer exponential: hops 1, 2, 4, a period of 3 steps. No staleness: every
#: step mixes its in-neighbour's same step (with staleness a round's first step may go on
#: without it, and its mass is mixed a step later).
EXACT: dict[str, Any] = {
    "agents": 8, "topology": "one-peer-exponential", "task": {"name": "consensus"},
    "network": {"loss": 0.0}, "eval_every": 1, "staleness": 0, "wait_timeout_s": 10.0,
}  # fmt: skip


def _distances(results: dict[str, Any]) -> list[float]:
    return [row["consensus_distance"] for row in results["rounds"][1:]]


def test_a_period_of_steps_a_round_averages_exactly_in_every_round(tmp_path: Path) -> None:
    config = load_config(None, {**EXACT, "rounds": 3, "mixing_steps": 3, "mode": "inproc"})
    results = run_fleet(config, tmp_path / "three").to_json()
    assert results["final"]["complete"]
    assert all(d < 1e-12 for d in _distances(results)), _distances(results)
    assert results["final"]["messages_sent"] == 8 * 3 * 3  # one message a step
    # One step a round: one hop a round, not the average yet.
    single = load_config(None, {**EXACT, "rounds": 3, "mixing_steps": 1, "mode": "inproc"})
    one = run_fleet(single, tmp_path / "one").to_json()
    assert _distances(one)[0] > 1e-3
    assert one["final"]["messages_sent"] == 8 * 3


def test_the_virtual_clock_takes_the_steps_of_a_round_as_events(tmp_path: Path) -> None:
    """Over a wireless channel on the virtual clock: each step a message per out-neighbour,
    the fleet closer together at every round than at one step, and exact in the end."""
    base = read_scenario(scenario_path("wifi-indoor"))
    settings = {"mode": "virtual", "agents": 10, "rounds": 20, "task": {"name": "consensus"},
                "eval_every": 1}  # fmt: skip
    runs = {
        steps: run_fleet(
            load_config(None, {**settings, "mixing_steps": steps}, base=base), tmp_path / str(steps)
        ).to_json()
        for steps in (1, 3)
    }
    one, three = runs[1], runs[3]
    assert three["final"]["complete"] and three["final"]["relative_error"] < 1e-6
    assert three["final"]["messages_sent"] > 2.5 * one["final"]["messages_sent"]
    closer = [t < o for t, o in zip(_distances(three), _distances(one), strict=True)]
    assert all(closer[:10]), (_distances(three), _distances(one))


def test_several_steps_a_round_stay_exact_under_loss(tmp_path: Path) -> None:
    settings = {**EXACT, "topology": "ring", "rounds": 40, "mixing_steps": 4,
                "network": {"loss": 0.3}, "mode": "inproc"}  # fmt: skip
    results = run_fleet(load_config(None, settings), tmp_path).to_json()
    assert results["final"]["messages_dropped"] > 0
    assert results["final"]["relative_error"] < 1e-9


def test_the_fast_paths_leave_several_steps_to_the_agents(tmp_path: Path) -> None:
    """The batched and fast virtual paths take one gossip step a round: a run that asks for
    more runs on agents (``auto`` keeps one step for consensus, so they still take it)."""
    config = load_config(None, {**EXACT, "rounds": 2})
    assert batched_refusal(config, network_for(config)) is None
    assert fast_refusal(config, network_for(config)) is None
    several = load_config(None, {**EXACT, "rounds": 2, "mixing_steps": 2})
    why = "the agents take several gossip steps a round"
    assert why in (fast_refusal(several, network_for(several)) or "")
    assert why in (batched_refusal(several, network_for(several)) or "")


def test_agent_processes_take_a_period_of_steps_over_grpc(tmp_path: Path) -> None:
    """Real agent processes: the steps' messages cross gRPC with their step, the waits line
    the steps up, and the fleet agrees far sooner than at one step a round. (Not exactly
    each round, as in lock step: an in-neighbour ahead of the agent may deliver a later
    step's message before the agent mixes this one.)"""
    runs = {
        steps: run_fleet(
            load_config(None, {**EXACT, "rounds": 6, "mixing_steps": steps}), tmp_path / str(steps)
        ).to_json()
        for steps in (1, 3)
    }
    one, three = runs[1], runs[3]
    assert three["final"]["complete"]
    # One message a step to its phase's out-neighbour (a few fewer if a push failed at the
    # start, to a peer that had no neighbours yet: it is tried again at the next probe).
    assert 0.9 * 8 * 6 * 3 <= three["final"]["messages_sent"] <= 8 * 6 * 3
    assert three["final"]["relative_error"] < one["final"]["relative_error"]
    # Measured: 0.08-0.1 after one round at three steps, against 0.47-0.54 at one.
    assert _distances(three)[0] < 0.5 * _distances(one)[0]


def test_agent_processes_measure_their_steps_and_agree_on_a_count(tmp_path: Path) -> None:
    """At auto, agent processes start from the rule's count (a one-peer exponential graph's
    period), measure what a further step costs against a one-step round, and the fleet takes
    the fewest any agent asks for: whatever this machine measures, every agent ends the run
    at the same count."""
    settings = {"agents": 8, "topology": "one-peer-exponential", "rounds": 7,
                "task": {"name": "digits"}, "network": {"loss": 0.0}}  # fmt: skip
    results = run_fleet(load_config(None, settings), tmp_path).to_json()
    assert results["final"]["complete"]
    last: dict[str, float] = {}
    for path in sorted((tmp_path / "agents").glob("*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        assert records[1]["scalars"]["mixing_steps"] == 3  # the rule's: one period
        last[path.stem] = records[-1]["scalars"]["mixing_steps"]
    assert len(last) == 8 and len(set(last.values())) == 1, last
    assert set(last.values()) <= {1.0, 3.0}
    for log_file in sorted((tmp_path / "logs").glob("agent-*.log")):
        assert "gossip steps a round: a one-step round took" in log_file.read_text()
