"""Topology policies: strong connectivity through failures, joins and returns."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from airgossip.common.identity import natural_order
from airgossip.common.topology import TopologyError, is_strongly_connected
from airgossip.coordinator.graphs import FleetGraph, join_components, splice_out
from airgossip.coordinator.policy import (
    POLICIES,
    EdgeListPolicy,
    KOutPolicy,
    TopologySpec,
    make_policy,
)

IDS = tuple(f"agent-{i}" for i in range(8))


def check(graph: FleetGraph, alive: tuple[str, ...]) -> None:
    assert graph.ids == alive
    union = graph.graph.union()
    assert not union.diagonal().any(), "self loops"
    assert is_strongly_connected(union), f"not strongly connected over {alive}"


@pytest.mark.parametrize(
    "name", ["complete", "ring", "directed-ring", "exponential", "erdos-renyi"]
)
def test_static_topologies_survive_any_two_failures_and_restore_returners(name: str) -> None:
    policy = make_policy(TopologySpec(name, seed=1))
    start = policy.graph(IDS, None, 1)
    check(start, IDS)
    for dead in itertools.combinations(IDS, 2):
        alive = tuple(i for i in IDS if i not in dead)
        repaired = policy.graph(alive, start, 2)
        check(repaired, alive)
        # Edges between survivors are kept; only bypasses around the dead are added.
        before = start.graph.phases[0][np.ix_(*[[IDS.index(a) for a in alive]] * 2)]
        assert (repaired.graph.phases[0] >= before).all()
    back = policy.graph(IDS, repaired, 3)
    assert all((a == b).all() for a, b in zip(back.graph.phases, start.graph.phases, strict=True))


def test_splice_out_keeps_every_path_through_the_removed_node() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(3, 10))
        a = rng.random((n, n)) < 0.3
        np.fill_diagonal(a, False)
        join_components(a, rng)
        assert is_strongly_connected(a)
        node = int(rng.integers(n))
        splice_out(a, node)
        keep = [i for i in range(n) if i != node]
        assert is_strongly_connected(a[np.ix_(keep, keep)])


def test_join_components_connects_any_digraph() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        a = rng.random((n, n)) < rng.uniform(0, 0.2)
        np.fill_diagonal(a, False)
        join_components(a, rng)
        assert is_strongly_connected(a)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_k_out_stays_strongly_connected_through_churn(k: int) -> None:
    rng = np.random.default_rng(k)
    policy = KOutPolicy(TopologySpec("k-out", seed=7, out_degree=k))
    alive = set(IDS[:5])
    graph = policy.graph(natural_order(alive), None, 1)
    next_id = 8
    for epoch in range(2, 300):
        event = rng.choice(["die", "return", "newcomer"])
        if event == "die" and len(alive) > 1:
            for victim in rng.choice(sorted(alive), size=min(2, len(alive) - 1), replace=False):
                alive.discard(str(victim))
        elif event == "return":
            alive.add(f"agent-{rng.integers(next_id)}")
        else:
            alive.add(f"agent-{next_id}")
            next_id += 1
        ordered = natural_order(alive)
        graph = policy.graph(ordered, graph, epoch)
        check(graph, ordered)
        degrees = graph.graph.union().sum(axis=1)
        assert (degrees >= min(k, len(ordered) - 1)).all()


def test_k_out_is_deterministic_and_rewires_only_around_the_dead() -> None:
    spec = TopologySpec("k-out", seed=3, out_degree=2)
    first, second = KOutPolicy(spec), KOutPolicy(spec)
    g1 = first.graph(IDS, None, 1)
    assert (g1.graph.phases[0] == second.graph(IDS, None, 1).graph.phases[0]).all()
    alive = tuple(i for i in IDS if i not in ("agent-2", "agent-5"))
    g2 = first.graph(alive, g1, 2)
    check(g2, alive)
    before = {e for e in g1.edges()[0] if "agent-2" not in e and "agent-5" not in e}
    assert before <= set(g2.edges()[0])  # edges between survivors all stay


def test_one_peer_exponential_is_rebuilt_over_the_living() -> None:
    policy = make_policy(TopologySpec("one-peer-exponential"))
    assert policy.open_membership
    graph = policy.graph(IDS, None, 1)
    assert graph.graph.period == 3
    check(graph, IDS)
    alive = IDS[:5]
    smaller = policy.graph(alive, graph, 2)
    check(smaller, alive)
    assert smaller.graph.period == 3 and smaller.graph.union().sum(axis=1).max() <= 3


def test_edge_list_from_scenario_and_replaced_at_run_time() -> None:
    ring = tuple((i, (i + 1) % 4) for i in range(4))
    policy = make_policy(TopologySpec("edges", edges=ring))
    assert isinstance(policy, EdgeListPolicy)
    ids = IDS[:4]
    graph = policy.graph(ids, None, 1)
    assert graph.edges()[0] == [(ids[i], ids[(i + 1) % 4]) for i in range(4)]
    policy.set_edges([("agent-0", "agent-2"), ("agent-2", "agent-0"), ("agent-1", "agent-3")])
    replaced = policy.graph(ids, graph, 2)
    assert set(replaced.edges()[0]) == {
        ("agent-0", "agent-2"), ("agent-2", "agent-0"), ("agent-1", "agent-3"),
    }  # fmt: skip
    assert not replaced.strongly_connected  # an emulator's radio graph may well be split
    with pytest.raises(TopologyError, match="'agent-9', which is not in the fleet"):
        policy.set_edges([("agent-0", "agent-9")])
    with pytest.raises(TopologyError, match="self loop"):
        policy.set_edges([("agent-1", "agent-1")])
    restored = make_policy(TopologySpec("edges", edges=ring))
    restored.restore(policy.state())
    again = restored.graph(ids, None, 3)
    assert set(again.edges()[0]) == set(replaced.edges()[0])


def test_unknown_topology_lists_every_policy() -> None:
    with pytest.raises(TopologyError, match="unknown topology 'star'") as info:
        make_policy(TopologySpec("star"))
    assert all(name in str(info.value) for name in POLICIES)
    assert "k-out" in POLICIES
    with pytest.raises(TopologyError, match="out-degree"):
        make_policy(TopologySpec("k-out", out_degree=0))


def test_fleet_graph_round_trips_through_json() -> None:
    graph = make_policy(TopologySpec("one-peer-exponential")).graph(IDS, None, 1)
    back = FleetGraph.from_json(graph.to_json())
    assert back.ids == graph.ids
    assert all((a == b).all() for a, b in zip(back.graph.phases, graph.graph.phases, strict=True))
