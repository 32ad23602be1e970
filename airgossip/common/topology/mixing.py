"""Mixing weights for a graph and their spectral properties.

Convention: ``W[j, i]`` is the share of node ``i``'s mass that goes to node ``j``, so a
column-stochastic ``W`` (columns sum to one) conserves the sum of all values: what push-sum
needs on directed graphs. Node ``i`` only needs its own column, which it can compute from its
out-degree alone.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from airgossip.common.topology.graphs import Adjacency, Graph, adjacency_edges

if TYPE_CHECKING:  # SciPy is imported where a sparse matrix is made (settings checks need none)
    from scipy.sparse import csc_array, csr_array

log = logging.getLogger(__name__)

#: Fleets above this many nodes get their mixing weights as sparse matrices and the second
#: eigenvalue from an iterative solver: the dense forms are n x n (800 MB of float64 at
#: 10,000 nodes) and a dense eigendecomposition is cubic in n (over 10 minutes at 10,000).
#: Fleets up to it keep the dense forms, so their figures are unchanged.
DENSE_LIMIT = 1024


@dataclass(frozen=True)
class Phase:
    """One node's view of one phase of the mixing matrix: a column of ``W``.

    Attributes
    ----------
    self_weight:
        ``W[i, i]``: the share of its own mass a node keeps.
    out_weights:
        ``{peer: W[peer, i]}``: the share sent to each out-neighbour.
    in_neighbours:
        Peers that send to this node during the phase.
    """

    self_weight: float
    out_weights: dict[str, float]
    in_neighbours: tuple[str, ...]

    def __post_init__(self) -> None:
        total = self.self_weight + sum(self.out_weights.values())
        if not np.isclose(total, 1.0, atol=1e-9):
            raise ValueError(f"a node's mixing weights must sum to 1, got {total}")
        if self.self_weight < 0 or any(w < 0 for w in self.out_weights.values()):
            raise ValueError("mixing weights must be non-negative")


def column_stochastic(adjacency: np.ndarray) -> np.ndarray:
    """Uniform push-sum weights: ``W[j, i] = 1 / (d_out(i) + 1)`` for ``j`` in out(i) and i."""
    n = adjacency.shape[0]
    w = np.zeros((n, n))
    for i in range(n):
        targets = [i, *np.flatnonzero(adjacency[i])]
        w[targets, i] = 1.0 / len(targets)
    return w


def metropolis_hastings(adjacency: np.ndarray) -> np.ndarray:
    """Doubly stochastic Metropolis-Hastings weights for an undirected graph.

    ``W[i, j] = 1 / (1 + max(d_i, d_j))`` on edges, the rest on the diagonal.
    """
    if not (adjacency == adjacency.T).all():
        raise ValueError("Metropolis-Hastings weights need an undirected graph")
    n = adjacency.shape[0]
    degree = adjacency.sum(axis=1)
    w = np.zeros((n, n))
    for i in range(n):
        for j in np.flatnonzero(adjacency[i]):
            w[i, j] = 1.0 / (1.0 + max(degree[i], degree[j]))
        w[i, i] = 1.0 - w[i].sum()
    return w


def mixing_matrices(graph: Graph, scheme: str = "column-stochastic") -> tuple[np.ndarray, ...]:
    """The mixing matrix of every phase of ``graph`` under a weighting scheme (dense, even
    for a graph held sparse)."""
    phases = [_dense(a) for a in graph.phases]
    if scheme == "column-stochastic":
        return tuple(column_stochastic(a) for a in phases)
    if scheme == "metropolis-hastings":
        return tuple(metropolis_hastings(a) for a in phases)
    raise ValueError(f"unknown weighting scheme '{scheme}'")


def _dense(adjacency: Adjacency) -> np.ndarray:
    """``adjacency`` as a dense array, without importing SciPy for a dense one: a small
    fleet's coordinator then never imports it (12 MiB of the launcher's memory)."""
    if isinstance(adjacency, np.ndarray):
        return adjacency
    return np.asarray(adjacency.toarray())


def sparse_mixing_matrices(
    graph: Graph, scheme: str = "column-stochastic"
) -> tuple[csc_array, ...]:
    """:func:`mixing_matrices` as sparse (CSC) matrices, built from the edges alone.

    Column-stochastic weights equal the dense ones exactly; a Metropolis-Hastings self
    weight (one minus its row's sum) may differ from the dense one in the last bit, since the
    sum runs over the edges only.
    """
    if scheme not in ("column-stochastic", "metropolis-hastings"):
        raise ValueError(f"unknown weighting scheme '{scheme}'")
    return tuple(_sparse_mixing(a, scheme) for a in graph.phases)


def _sparse_mixing(adjacency: Adjacency, scheme: str) -> csc_array:
    from scipy.sparse import csc_array

    n = adjacency.shape[0]
    senders, receivers = adjacency_edges(adjacency)  # edge i -> j: W[j, i]
    diagonal = np.arange(n)
    if scheme == "column-stochastic":
        share = 1.0 / (np.bincount(senders, minlength=n) + 1.0)
        rows = np.concatenate([receivers, diagonal])
        cols = np.concatenate([senders, diagonal])
        data = np.concatenate([share[senders], share])
    else:
        if not Graph("", (adjacency,)).is_undirected:
            raise ValueError("Metropolis-Hastings weights need an undirected graph")
        degree = np.bincount(senders, minlength=n)
        weight = 1.0 / (1.0 + np.maximum(degree[senders], degree[receivers]))
        row_sum = np.bincount(senders, weights=weight, minlength=n)
        rows = np.concatenate([senders, diagonal])
        cols = np.concatenate([receivers, diagonal])
        data = np.concatenate([weight, 1.0 - row_sum])
    return csc_array((data, (rows, cols)), shape=(n, n))


def mixing_lambda2(
    graph: Graph, scheme: str = "column-stochastic", *, dense_limit: int = DENSE_LIMIT
) -> float:
    """:func:`second_largest_eigenvalue` of ``graph``'s mixing weights, dense up to
    ``dense_limit`` nodes and sparse above it (never an n x n array there). A caller whose
    graphs have few edges a node passes a lower limit: an iterative solve of a sparse graph
    of a few hundred nodes takes milliseconds where the dense one takes a second or more."""
    if graph.n <= dense_limit:
        return second_largest_eigenvalue(mixing_matrices(graph, scheme))
    return second_largest_eigenvalue(sparse_mixing_matrices(graph, scheme))


def second_largest_eigenvalue(
    matrices: tuple[np.ndarray, ...] | tuple[csc_array, ...] | np.ndarray,
) -> float:
    """Second-largest eigenvalue modulus of ``W`` (of the product over one period).

    Smaller is better mixed: an error shrinks roughly by this factor per period. For a
    column-stochastic matrix the largest eigenvalue is 1.

    Sparse matrices (or more than :data:`DENSE_LIMIT` nodes) are solved iteratively (ARPACK,
    the two largest moduli of the product applied phase by phase, relative tolerance 1e-6);
    the figure is informative only, so a solve that does not converge gives NaN and a log
    line, not an error.
    """
    mats = (matrices,) if isinstance(matrices, np.ndarray) else matrices
    n = mats[0].shape[0]
    if n > DENSE_LIMIT or not isinstance(mats[0], np.ndarray):
        from scipy.sparse import csr_array

        return _iterative_lambda2([csr_array(w) for w in mats])
    product = np.eye(mats[0].shape[0])
    for w in mats:
        product = w @ product
    if product.shape[0] == 1:
        return 0.0
    moduli = np.sort(np.abs(np.linalg.eigvals(product)))[::-1]
    return float(moduli[1])


def _iterative_lambda2(mats: list[csr_array]) -> float:
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigs

    n = mats[0].shape[0]
    if n == 1:
        return 0.0
    if n <= 16:  # ARPACK needs k < n - 1; tiny matrices are cheap to solve densely
        dense = np.eye(n)
        for w in mats:
            dense = w.toarray() @ dense
        return float(np.sort(np.abs(np.linalg.eigvals(dense)))[::-1][1])

    def apply(x: np.ndarray) -> np.ndarray:
        for w in mats:
            x = w @ x
        return x

    operator = LinearOperator((n, n), matvec=apply, dtype=np.float64)
    # A fixed start vector: the same figure for the same graph on every run.
    start = np.random.default_rng(0).random(n)
    try:
        values = eigs(operator, k=2, which="LM", tol=1e-6, v0=start, maxiter=20 * n,
                      return_eigenvectors=False)  # fmt: skip
    except ArpackNoConvergence:
        log.info("the mixing |lambda2| of %d nodes did not converge; reported as unknown", n)
        return math.nan
    moduli = np.sort(np.abs(values))[::-1]
    return float(moduli[1])


def node_phases(
    graph: Graph,
    ids: list[str],
    node: int,
    scheme: str = "column-stochastic",
    *,
    matrices: tuple[np.ndarray, ...] | None = None,
) -> list[Phase]:
    """Node ``node``'s column of every phase's mixing matrix, peers named by ``ids``.

    Pass ``matrices`` (from :func:`mixing_matrices`) when calling this for every node: building
    them is quadratic in the fleet size (:func:`sparse_node_phases` is linear in the edges).
    """
    phases = []
    for w in matrices if matrices is not None else mixing_matrices(graph, scheme):
        column, row = w[:, node], w[node, :]
        out = {ids[j]: float(column[j]) for j in np.flatnonzero(column > 0) if j != node}
        incoming = tuple(ids[j] for j in np.flatnonzero(row > 0) if j != node)
        phases.append(Phase(float(w[node, node]), out, incoming))
    return phases


def sparse_node_phases(
    matrices: tuple[tuple[csc_array, csr_array], ...], ids: list[str], node: int
) -> list[Phase]:
    """:func:`node_phases` from sparse matrices, each given as ``(W as CSC, W as CSR)`` (its
    columns and its rows in O(degree)): the same phases as the dense ``W`` gives."""
    phases = []
    for columns, rows in matrices:
        start, stop = columns.indptr[node], columns.indptr[node + 1]
        receivers, shares = columns.indices[start:stop].tolist(), columns.data[start:stop].tolist()
        start, stop = rows.indptr[node], rows.indptr[node + 1]
        senders, weights = rows.indices[start:stop].tolist(), rows.data[start:stop].tolist()
        self_weight = next((v for j, v in zip(receivers, shares, strict=True) if j == node), 0.0)
        out = {ids[j]: v for j, v in zip(receivers, shares, strict=True) if j != node and v > 0}
        incoming = tuple(ids[j] for j, v in zip(senders, weights, strict=True)
                         if j != node and v > 0)  # fmt: skip
        phases.append(Phase(float(self_weight), out, incoming))
    return phases
