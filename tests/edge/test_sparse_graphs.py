"""Large sparse topologies are built as sparse arrays: the same graph as the dense form,
read the same way by every caller (edges, neighbours, mixing weights, |lambda2|)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import csr_array

import airgossip.common.topology.graphs as graphs
from airgossip.common.topology import (
    adjacency_edges,
    assignments_for_graph,
    build_graph,
    mixing_lambda2,
    sparse_mixing_matrices,
)


@pytest.mark.parametrize("name", ["ring", "directed-ring", "exponential", "one-peer-exponential"])
def test_a_sparse_graph_is_the_dense_one(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    n = 40
    dense = build_graph(name, n)
    monkeypatch.setattr(graphs, "SPARSE_LIMIT", 10)
    sparse = build_graph(name, n)
    assert sparse.sparse and not dense.sparse
    assert sparse.period == dense.period and sparse.n == n
    assert sparse.edge_count() == dense.edge_count()
    assert sparse.is_undirected == dense.is_undirected
    assert (csr_array(sparse.union()).toarray() == dense.union()).all()
    for r in range(dense.period):
        assert (csr_array(sparse.phase(r)).toarray() == dense.phase(r)).all()
        for a, b in zip(sparse.edges(r), dense.edges(r), strict=True):
            assert a.tolist() == b.tolist()
        for node in (0, 7, n - 1):
            assert sparse.out_neighbours(node, r) == dense.out_neighbours(node, r)
            assert sparse.in_neighbours(node, r) == dense.in_neighbours(node, r)
    for w_sparse, w_dense in zip(sparse_mixing_matrices(sparse), sparse_mixing_matrices(dense),
                                 strict=True):  # fmt: skip
        assert (w_sparse != w_dense).count_nonzero() == 0
    assert mixing_lambda2(sparse) == pytest.approx(mixing_lambda2(dense), rel=1e-6)
    ids = [f"a{i}" for i in range(n)]
    addresses = {i: f"mem://{i}" for i in ids}
    assert assignments_for_graph(sparse, addresses) == assignments_for_graph(dense, addresses)


def test_a_fleet_of_100000_gets_its_graph_without_an_n_by_n_array() -> None:
    graph = build_graph("exponential", 100_000)
    assert graph.sparse
    senders, receivers = graph.edges()
    assert senders.shape == receivers.shape == (17 * 100_000,)  # hops 1, 2, ..., 2**16
    assert graph.edge_count() == 17 * 100_000
    assert graph.out_neighbours(99_999)[:3] == [0, 1, 3]
    assert np.all(np.diff(senders) >= 0)
    assert adjacency_edges(graph.phase(0))[1][:3].tolist() == [1, 2, 4]
