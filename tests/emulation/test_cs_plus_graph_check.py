"""CS+-RG's radius rule against the run's graph, checked before anything trains: an agent
whose neighbours hold no more than twice the insiders' weight never mixes. A graph where no
agent can mix is refused in one line; one where some cannot is run, with one warning that
names them; a dense graph says nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from airgossip.emulation.fleets import preflight
from airgossip.emulation.networks import network_for
from airgossip.scenario.config import ConfigError, load_config

WARNING = "too few neighbours"


def config(topology: str, agents: int = 8, **more: Any) -> Any:
    return load_config(None, {
        "mode": "inproc", "task": {"name": "consensus"}, "agents": agents, "rounds": 5,
        "topology": topology, "algorithm": "cs-plus-gossip", **more,
    })  # fmt: skip


def lonely_edges() -> list[list[int]]:
    """Agents 1..8 all linked; agent 0 linked to 1 and 2 only (degree 2 beside degree 8)."""
    edges = [[i, j] for i in range(1, 9) for j in range(1, 9) if i != j]
    return [*edges, [0, 1], [1, 0], [0, 2], [2, 0]]


def test_a_ring_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        preflight(config("ring"))
    message = str(err.value)
    assert "\n" not in message
    assert "cs-plus-gossip with byzantine=1: no agent can ever mix on 'ring'" in message
    assert "neighbours (2)" in message and "smaller byzantine" in message


def test_a_low_degree_agent_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    cfg = config("edges", agents=9, edges=lonely_edges())
    with caplog.at_level(logging.WARNING):
        plan = preflight(cfg)
        plan.network.first_graph()  # asked again: not said again
    said = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert said == [
        "cs-plus-gossip with byzantine=1: agent agent-0 has too few neighbours (2) to ever "
        "mix (clipping radius always 0: local training only); give a denser topology or a "
        "smaller byzantine"
    ]


def test_a_dense_graph_or_no_insiders_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        preflight(config("complete"))
        preflight(config("ring", algorithm_options={"byzantine": 0}))
        preflight(config("edges", agents=9, edges=lonely_edges(), algorithm="clipped-gossip"))
    assert not [r for r in caplog.records if WARNING in r.getMessage()]


def test_a_switching_schedule_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    cfg = config("ring", switching={"topologies": ["ring", "complete"], "at_rounds": [2]})
    with caplog.at_level(logging.WARNING):
        network_for(cfg).first_graph()
    said = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(said) == 1 and said[0].endswith(
        "(clipping radius always 0: local training only) on the first graph; give a denser "
        "topology or a smaller byzantine"
    )
    assert "agent-0, agent-1" in said[0]
