"""Mixing weights for a graph and their spectral properties.

Convention: ``W[j, i]`` is the share of node ``i``'s mass that goes to node ``j``, so a
column-stochastic ``W`` (columns sum to one) conserves the sum of all values: what push-sum
needs on directed graphs. Node ``i`` only needs its own column, which it can compute from its
out-degree alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge.topology.graphs import Graph


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
    """The mixing matrix of every phase of ``graph`` under a weighting scheme."""
    if scheme == "column-stochastic":
        return tuple(column_stochastic(a) for a in graph.phases)
    if scheme == "metropolis-hastings":
        return tuple(metropolis_hastings(a) for a in graph.phases)
    raise ValueError(f"unknown weighting scheme '{scheme}'")


def second_largest_eigenvalue(matrices: tuple[np.ndarray, ...] | np.ndarray) -> float:
    """Second-largest eigenvalue modulus of ``W`` (of the product over one period).

    Smaller is better mixed: an error shrinks roughly by this factor per period. For a
    column-stochastic matrix the largest eigenvalue is 1.
    """
    mats = (matrices,) if isinstance(matrices, np.ndarray) else matrices
    product = np.eye(mats[0].shape[0])
    for w in mats:
        product = w @ product
    if product.shape[0] == 1:
        return 0.0
    moduli = np.sort(np.abs(np.linalg.eigvals(product)))[::-1]
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
    them is quadratic in the fleet size.
    """
    phases = []
    for w in matrices if matrices is not None else mixing_matrices(graph, scheme):
        column, row = w[:, node], w[node, :]
        out = {ids[j]: float(column[j]) for j in np.flatnonzero(column > 0) if j != node}
        incoming = tuple(ids[j] for j in np.flatnonzero(row > 0) if j != node)
        phases.append(Phase(float(w[node, node]), out, incoming))
    return phases
