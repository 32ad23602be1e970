"""Topology math: weights, connectivity and the spectral gap, pinned to known values."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from airgossip.common.topology import (
    TOPOLOGIES,
    TopologyError,
    assignments_for_graph,
    build_graph,
    column_stochastic,
    is_strongly_connected,
    metropolis_hastings,
    mixing_matrices,
    second_largest_eigenvalue,
)
from tests.support.cli import ROOT


@pytest.mark.parametrize("name", [t for t in TOPOLOGIES if t != "edges"])
@pytest.mark.parametrize("n", [2, 5, 8, 16])
def test_every_topology_is_column_stochastic_and_strongly_connected(name: str, n: int) -> None:
    graph = build_graph(name, n, seed=3)
    assert is_strongly_connected(graph.union())
    for adjacency, w in zip(graph.phases, mixing_matrices(graph), strict=True):
        assert not adjacency.diagonal().any()
        np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
        assert (w >= 0).all()
        # W[j, i] > 0 exactly on i's out-edges and i itself
        np.testing.assert_array_equal(w > 0, adjacency.T | np.eye(n, dtype=bool))


@pytest.mark.parametrize(
    ("name", "n", "expected"),
    [
        ("ring", 8, 0.805),
        ("ring", 16, 0.949),
        ("directed-ring", 8, 0.924),
        ("directed-ring", 16, 0.981),
        ("exponential", 8, 0.500),
        ("exponential", 16, 0.600),
        ("exponential", 32, 0.667),
        ("complete", 8, 0.0),
    ],
)
def test_second_largest_eigenvalue_matches_reference(name: str, n: int, expected: float) -> None:
    assert second_largest_eigenvalue(mixing_matrices(build_graph(name, n))) == pytest.approx(
        expected, abs=5e-4
    )


def test_one_peer_exponential_averages_exactly_in_log2_n_rounds() -> None:
    graph = build_graph("one-peer-exponential", 16)
    assert graph.period == 4
    assert all(int(a.sum(axis=1).max()) == 1 for a in graph.phases)
    assert second_largest_eigenvalue(mixing_matrices(graph)) < 1e-12
    values = np.random.default_rng(0).normal(size=16)
    x = values.copy()
    for w in mixing_matrices(graph):
        x = w @ x
    np.testing.assert_allclose(x, values.mean(), atol=1e-12)


def test_directed_exponential_out_neighbours_are_powers_of_two() -> None:
    graph = build_graph("exponential", 16)
    assert graph.out_neighbours(0) == [1, 2, 4, 8]
    assert graph.in_neighbours(0) == [8, 12, 14, 15]
    assert not graph.is_undirected
    assert build_graph("ring", 6).is_undirected


def test_metropolis_hastings_is_doubly_stochastic_and_refuses_directed_graphs() -> None:
    graph = build_graph("erdos-renyi", 12, seed=1)
    undirected = graph.union() | graph.union().T
    w = metropolis_hastings(undirected)
    np.testing.assert_allclose(w.sum(axis=0), 1.0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="undirected"):
        metropolis_hastings(build_graph("directed-ring", 4).phases[0])


def test_explicit_edges_and_their_errors() -> None:
    graph = build_graph("edges", 3, edges=[(0, 1), (1, 2), (2, 0)])
    assert graph.out_neighbours(2) == [0]
    with pytest.raises(TopologyError, match="not strongly connected"):
        build_graph("edges", 3, edges=[(0, 1), (1, 2)])
    with pytest.raises(TopologyError, match="outside"):
        build_graph("edges", 3, edges=[(0, 5)])
    with pytest.raises(TopologyError, match="self loop"):
        build_graph("edges", 3, edges=[(1, 1)])
    with pytest.raises(TopologyError, match="needs an edge list"):
        build_graph("edges", 3)


def test_unknown_topology_names_the_allowed_ones() -> None:
    with pytest.raises(TopologyError, match="choose one of: complete, ring"):
        build_graph("star", 4)


def test_erdos_renyi_is_seeded() -> None:
    a = build_graph("erdos-renyi", 20, seed=7).phases[0]
    b = build_graph("erdos-renyi", 20, seed=7).phases[0]
    c = build_graph("erdos-renyi", 20, seed=8).phases[0]
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


def test_assignments_give_each_agent_its_column() -> None:
    graph = build_graph("exponential", 8)
    addresses = {f"a{i}": f"host:{i}" for i in range(8)}
    assignments = assignments_for_graph(graph, addresses)
    w = column_stochastic(graph.phases[0])
    a3 = assignments["a3"]
    assert a3.lambda2 == pytest.approx(0.5)
    phase = a3.phase(0)
    assert phase.self_weight == pytest.approx(w[3, 3])
    assert phase.out_weights == {f"a{j}": pytest.approx(w[j, 3]) for j in (4, 5, 7)}
    assert set(phase.in_neighbours) == {"a2", "a1", "a7"}
    assert set(a3.peers) == {"a1", "a2", "a4", "a5", "a7"}


def test_strong_connectivity_walked_in_numpy_agrees_with_scipy() -> None:
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(0)
    connected = 0
    for _ in range(600):
        n = int(rng.integers(2, 40))
        a = rng.random((n, n)) < rng.random() * 0.3
        np.fill_diagonal(a, False)
        count, _ = connected_components(csr_array(a), directed=True, connection="strong")
        assert is_strongly_connected(a) == (count == 1)
        assert is_strongly_connected(csr_array(a)) == (count == 1)  # the sparse path
        connected += count == 1
    assert 100 < connected < 500  # both answers are exercised


def test_a_small_fleets_weights_and_assignments_need_no_scipy() -> None:
    """A dense graph's mixing weights, |lambda2| and assignments are NumPy alone: the
    coordinator a launcher embeds for a small fleet never imports SciPy (12 MiB of its
    memory). Checked in a fresh interpreter, where nothing else imported it first."""
    code = (
        "import sys\n"
        "from airgossip.common.topology import assignments_for_graph, build_graph\n"
        "from airgossip.common.topology.mixing import mixing_lambda2\n"
        "graph = build_graph('exponential', 8)\n"
        "assignments = assignments_for_graph(graph, {f'a{i}': f'h:{i}' for i in range(8)})\n"
        "print(round(mixing_lambda2(graph), 6), round(assignments['a3'].lambda2, 6),\n"
        "      sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.split() == ["0.5", "0.5", "[]"], done.stdout
