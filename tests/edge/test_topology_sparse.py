"""Sparse mixing weights for large fleets: the same phases as the dense ones, the same
|lambda2| within the solver's tolerance, and no n x n array on the way."""

from __future__ import annotations

import numpy as np
import pytest

import airgossip.common.topology.assignment as assignment_module
import airgossip.common.topology.mixing as mixing_module
from airgossip.common.topology import (
    TOPOLOGIES,
    assignments_for_graph,
    build_graph,
    is_strongly_connected,
    mixing_matrices,
    node_phases,
    second_largest_eigenvalue,
    sparse_mixing_matrices,
    sparse_node_phases,
)


@pytest.mark.parametrize("name", [t for t in TOPOLOGIES if t != "edges"])
@pytest.mark.parametrize("n", [3, 9, 24])
@pytest.mark.parametrize("scheme", ["column-stochastic", "metropolis-hastings"])
def test_sparse_phases_equal_the_dense_ones(name: str, n: int, scheme: str) -> None:
    graph = build_graph(name, n, seed=5)
    if scheme == "metropolis-hastings" and not graph.is_undirected:
        with pytest.raises(ValueError, match="undirected"):
            sparse_mixing_matrices(graph, scheme)
        return
    ids = [f"agent-{k}" for k in range(n)]
    dense = mixing_matrices(graph, scheme)
    sparse = sparse_mixing_matrices(graph, scheme)
    for d, s in zip(dense, sparse, strict=True):
        np.testing.assert_allclose(s.toarray(), d, rtol=0, atol=1e-15)
    pairs = tuple((w, w.tocsr()) for w in sparse)
    for node in range(n):
        expected = node_phases(graph, ids, node, scheme, matrices=dense)
        got = sparse_node_phases(pairs, ids, node)
        for e, g in zip(expected, got, strict=True):
            assert g.out_weights == e.out_weights  # exact: the same divisions
            assert g.in_neighbours == e.in_neighbours
            assert g.self_weight == pytest.approx(e.self_weight, abs=1e-15)
    # The iterative solve agrees with the dense one.
    assert second_largest_eigenvalue(sparse) == pytest.approx(
        second_largest_eigenvalue(dense), abs=1e-6
    )


def test_ten_thousand_agents_get_their_columns_without_a_dense_matrix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a dense n x n computation at 10,000 nodes")

    monkeypatch.setattr(assignment_module, "mixing_matrices", refuse)
    monkeypatch.setattr(mixing_module.np.linalg, "eigvals", refuse)
    n = 10_000
    graph = build_graph("exponential", n)
    addresses = {f"a{k}": f"mem://a{k}" for k in range(n)}
    result = assignments_for_graph(graph, addresses)
    hops = [2**k for k in range(14)]  # 1 .. 8192: 14 out-neighbours, weight 1/15 each
    first = result["a0"].phase(1)
    assert first.out_weights == {f"a{h}": 1.0 / 15 for h in hops}
    assert first.self_weight == 1.0 / 15
    assert sorted(first.in_neighbours) == sorted(f"a{n - h}" for h in hops)
    assert set(result["a0"].peers) == {f"a{h}" for h in hops} | {f"a{n - h}" for h in hops}
    # W is circulant: its eigenvalues are (1 + sum over hops h of e^(2 pi i k h / n)) / 15.
    k = np.arange(n)
    circulant = (1 + sum(np.exp(2j * np.pi * k * h / n) for h in hops)) / 15
    expected = np.sort(np.abs(circulant))[::-1][1]  # 13/15
    assert result["a0"].lambda2 == pytest.approx(expected, abs=1e-6)


def test_strong_connectivity_by_components() -> None:
    two_rings = np.zeros((6, 6), dtype=bool)
    for start in (0, 3):
        for k in range(3):
            two_rings[start + k, start + (k + 1) % 3] = True
    assert not is_strongly_connected(two_rings)
    two_rings[2, 3] = True  # one way only
    assert not is_strongly_connected(two_rings)
    two_rings[5, 0] = True
    assert is_strongly_connected(two_rings)
