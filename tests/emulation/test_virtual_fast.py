"""The virtual clock's fast path for push-sum consensus against the agents themselves.

A seeded wireless run, fast and per-agent: the same verdict for every message (the link
shaper's journal), the same counters and virtual times exactly, estimates within 1e-9.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from airgossip.emulation.fleets.virtual import VirtualFleet
from airgossip.emulation.fleets.virtual_fast import fast_refusal
from airgossip.emulation.networks import network_for
from airgossip.emulation.networks.wireless import WirelessLinks
from airgossip.scenario.config import RunConfig, load_config, read_scenario
from airgossip.scenario.wireless import scenario_path


def config_of(preset: str, agents: int, rounds: int, area: float, **settings: Any) -> RunConfig:
    base: dict[str, Any] = read_scenario(scenario_path(preset))
    base["wireless"]["record"] = True  # the shaper keeps every verdict
    if "mobility" in base["wireless"]:
        mobility: dict[str, Any] = base["wireless"]["mobility"]
        mobility["area_m"] = [float(a) * area for a in mobility.get("area_m", [100.0, 100.0])]
    values = {"mode": "virtual", "agents": agents, "rounds": rounds, "seed": 7,
              "task": {"name": "consensus"}, **settings}  # fmt: skip
    return load_config(None, values, base=base)


def run(config: RunConfig, fast: bool) -> tuple[VirtualFleet, list[Any]]:
    fleet = VirtualFleet(config, network_for(config), fast=fast)
    assert fleet.fast is fast
    fleet.run()
    links = fleet.runtime
    assert isinstance(links, WirelessLinks)
    journal = links.run.shaper.journal
    assert journal is not None
    return fleet, journal


def assert_same(config: RunConfig) -> list[Any]:
    slow, slow_journal = run(config, fast=False)
    fast, fast_journal = run(config, fast=True)
    assert len(fast_journal) == len(slow_journal) > 0
    assert fast_journal == slow_journal  # every message: who, round, index, start, bytes, fate
    assert fast.clock_s() == slow.clock_s()
    assert fast.loop.events == slow.loop.events
    slow_records, fast_records = slow.records(), fast.records()
    assert list(fast_records) == list(slow_records)
    for agent_id, expected in slow_records.items():
        got = fast_records[agent_id]
        assert [(r.round, r.wall_s, r.final, r.counters, r.metrics) for r in got] == [
            (r.round, r.wall_s, r.final, r.counters, r.metrics) for r in expected
        ]
        for a, b in zip(got, expected, strict=True):
            assert a.scalars["weight"] == pytest.approx(b.scalars["weight"], rel=1e-12)
            assert a.estimate is not None and b.estimate is not None
            np.testing.assert_allclose(a.estimate, b.estimate, rtol=1e-9, atol=1e-12)
    return slow_journal


def test_lte_urban_64_agents_fast_equals_per_agent() -> None:
    # lte-urban at its own density (1,000 agents in 2 km square): 64 agents in 506 m.
    config = config_of("lte-urban", 64, 80, area=0.253)
    assert fast_refusal(config, network_for(config)) is None
    journal = assert_same(config)
    assert len(journal) > 10_000


def test_wifi_mobile_with_fading_and_losses_fast_equals_per_agent() -> None:
    config = config_of("wifi-outdoor-mobile", 48, 25, area=1.0)
    journal = assert_same(config)
    assert sum(m.drop for m in journal) > 0  # the parity covers dropped messages too


def test_fast_path_applies_only_to_push_sum_consensus() -> None:
    config = config_of("lte-urban", 8, 3, area=0.1, algorithm="push-sum-plain")
    assert "push-sum" in (fast_refusal(config, network_for(config)) or "")
    with pytest.raises(ValueError, match="fast path"):
        VirtualFleet(config, network_for(config), fast=True)
    assert not VirtualFleet(config, network_for(config)).fast
