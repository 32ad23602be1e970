"""One push-sum, four engines: the same scenarios through each.

The engines: the agents in lock step (``inproc``, each agent's own
:class:`~airgossip.edge.algorithms.push_sum.PushSum`), the batched engine (every agent as rows
of arrays, :mod:`airgossip.emulation.fleets.batched`), the agents on the virtual clock, and the
virtual clock's fast path (:mod:`airgossip.emulation.fleets.virtual_fast`). The two array
engines decide by push-sum's own rules (:mod:`airgossip.edge.algorithms.push_sum_rules`);
this suite holds them to the agents:

- every engine reaches the exact average, lossy or not (push-sum's exactness under loss);
- each array engine equals the agents on its own clock: every counter exactly, weights and
  estimates within 1e-9 relative;
- lossless, all four send the same messages and agree on the estimates.

The lock step and the virtual clock are different schedules (on the virtual clock an agent
mixes once it heard from its in-neighbours, or its wait timed out), so under loss they are
compared by what both must reach, not round by round.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

from airgossip.edge.algorithms.push_sum_rules import STARVED_WEIGHT
from airgossip.edge.observability.stats import RoundRecord
from airgossip.emulation.fleets import reference_answer
from airgossip.emulation.fleets.inproc import run_in_process
from airgossip.emulation.fleets.virtual import VirtualFleet
from airgossip.emulation.networks import network_for
from airgossip.scenario.config import RunConfig, load_config
from airgossip.scenario.results import summarise

RELATIVE = 1e-9

#: name: (settings, the largest final relative error from the exact average, or None where
#: the scenario is about something else than convergence)
SCENARIOS: dict[str, tuple[dict[str, Any], float | None]] = {
    "exponential, lossless": ({"topology": "exponential", "network": {"loss": 0.0}}, 1e-6),
    "ring, 30% loss": ({"agents": 8, "rounds": 120, "topology": "ring",
                        "network": {"loss": 0.3}}, 1e-4),
    "one-peer exponential (periodic), 20% loss": (
        {"topology": "one-peer-exponential", "network": {"loss": 0.2}}, 1e-4),
    # weights sink below STARVED_WEIGHT: an agent then keeps every share home
    "directed ring, 95% loss": ({"agents": 4, "rounds": 300, "topology": "directed-ring",
                                 "network": {"loss": 0.95}}, None),
}  # fmt: skip

#: engine: (mode, the array engine or the agents)
ENGINES = {
    "agents, lock step": ("inproc", False),
    "batched": ("inproc", True),
    "agents, virtual clock": ("virtual", False),
    "virtual fast path": ("virtual", True),
}
#: each array engine and the agents it must equal
PAIRS = [("batched", "agents, lock step"), ("virtual fast path", "agents, virtual clock")]


def config_of(scenario: str, engine: str) -> RunConfig:
    settings, _ = SCENARIOS[scenario]
    values = {"agents": 16, "rounds": 40, "seed": 5, "task": {"name": "consensus", "dim": 8},
              **settings, "mode": ENGINES[engine][0]}  # fmt: skip
    return load_config(None, values)


@cache
def records_of(scenario: str, engine: str) -> dict[str, list[RoundRecord]]:
    config = config_of(scenario, engine)
    mode, arrays = ENGINES[engine]
    if mode == "inproc":
        return run_in_process(config, batched=arrays)
    # A static network on the virtual clock (the command line sends those to inproc): the
    # same links as the lock step, on the agents' own schedule.
    fleet = VirtualFleet(config, network_for(config), fast=arrays)
    assert fleet.fast is arrays
    fleet.run()
    return fleet.records()


def finals(records: dict[str, list[RoundRecord]]) -> tuple[np.ndarray, np.ndarray]:
    last = [records[a][-1] for a in sorted(records)]
    assert all(r.final and r.estimate is not None for r in last)
    estimates = np.stack([np.asarray(r.estimate) for r in last])
    return estimates, np.array([r.scalars["weight"] for r in last])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_engine_reaches_the_exact_average(scenario: str, engine: str) -> None:
    bound = SCENARIOS[scenario][1]
    config = config_of(scenario, engine)
    records = records_of(scenario, engine)
    assert len(records) == config.agents
    assert all(len(r) > 1 and r[-1].round == config.rounds for r in records.values())
    if bound is None:  # the starving ring: every engine starves its agents the same way
        weights = [r.scalars["weight"] for rs in records.values() for r in rs]
        assert sum(w < STARVED_WEIGHT for w in weights) > 10
        assert all(w > 0 for w in weights)
        return
    final = summarise(records, reference=reference_answer(config)).final
    assert final.relative_error is not None
    assert final.relative_error < bound
    if config.network.loss > 0:
        assert final.messages_dropped > 0.5 * config.network.loss * final.messages_sent


@pytest.mark.parametrize(("arrays", "agents"), PAIRS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_array_engines_equal_the_agents(scenario: str, arrays: str, agents: str) -> None:
    got, want = records_of(scenario, arrays), records_of(scenario, agents)
    assert sorted(got) == sorted(want)
    for agent_id, expected in want.items():
        mine = got[agent_id]
        assert [(r.round, r.wall_s if "virtual" in arrays else 0, r.final, r.counters)
                for r in mine] == [
            (r.round, r.wall_s if "virtual" in arrays else 0, r.final, r.counters)
            for r in expected
        ]  # fmt: skip
        for a, b in zip(mine, expected, strict=True):
            assert a.scalars["weight"] == pytest.approx(b.scalars["weight"], rel=RELATIVE)
            assert a.estimate is not None and b.estimate is not None
            np.testing.assert_allclose(a.estimate, b.estimate, rtol=RELATIVE, atol=1e-15)


def test_lossless_every_engine_sends_the_same_messages_and_agrees() -> None:
    scenario = "exponential, lossless"
    runs = {engine: records_of(scenario, engine) for engine in ENGINES}
    counts = {engine: sorted((a, r[-1].counters.messages_sent, r[-1].counters.bytes_sent)
                             for a, r in records.items())
              for engine, records in runs.items()}  # fmt: skip
    first = next(iter(counts.values()))
    assert all(c == first for c in counts.values()), counts
    config = config_of(scenario, "batched")
    out_degree = int(np.log2(config.agents))  # exponential graph: 1, 2, 4, 8 hops
    assert {sent for _, sent, _ in first} == {config.rounds * out_degree}
    estimates = {engine: finals(records)[0] for engine, records in runs.items()}
    reference = estimates["agents, lock step"]
    for engine, got in estimates.items():
        np.testing.assert_allclose(got, reference, rtol=1e-6, atol=1e-9, err_msg=engine)
