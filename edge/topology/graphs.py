"""Directed neighbour graphs, possibly time-varying, as boolean adjacency matrices.

``adjacency[i, j]`` is True when node ``i`` sends to node ``j``. A time-varying graph is a
periodic sequence of such matrices (its phases); round ``r`` uses phase ``r % period``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

TOPOLOGIES = (
    "complete",
    "ring",
    "directed-ring",
    "exponential",
    "one-peer-exponential",
    "erdos-renyi",
    "edges",
)


class TopologyError(ValueError):
    """A topology that cannot be built from the given arguments."""


@dataclass(frozen=True)
class Graph:
    """A directed graph on ``n`` nodes, possibly time-varying with a fixed period.

    Attributes
    ----------
    name:
        Topology name it was built from.
    phases:
        One ``(n, n)`` boolean adjacency matrix per phase; no self loops.
    """

    name: str
    phases: tuple[np.ndarray, ...]

    @property
    def n(self) -> int:
        return int(self.phases[0].shape[0])

    @property
    def period(self) -> int:
        return len(self.phases)

    def phase(self, round_index: int) -> np.ndarray:
        return self.phases[round_index % self.period]

    def out_neighbours(self, node: int, round_index: int = 0) -> list[int]:
        return [int(j) for j in np.flatnonzero(self.phase(round_index)[node])]

    def in_neighbours(self, node: int, round_index: int = 0) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.phase(round_index)[:, node])]

    @property
    def is_undirected(self) -> bool:
        """True when every phase is symmetric (each edge exists both ways)."""
        return all(bool((a == a.T).all()) for a in self.phases)

    def union(self) -> np.ndarray:
        """Adjacency of the union of all phases."""
        out = np.zeros_like(self.phases[0])
        for a in self.phases:
            out |= a
        return out

    def edge_count(self) -> int:
        return int(sum(int(a.sum()) for a in self.phases))


def is_strongly_connected(adjacency: np.ndarray) -> bool:
    """Whether every node can reach every other along directed edges."""
    from scipy.sparse import csr_array  # imported here: agents that never build graphs skip it
    from scipy.sparse.csgraph import connected_components

    n = adjacency.shape[0]
    if n == 1:
        return True
    count, _ = connected_components(csr_array(adjacency), directed=True, connection="strong")
    return bool(count == 1)


def _empty(n: int) -> np.ndarray:
    return np.zeros((n, n), dtype=bool)


def _complete(n: int) -> np.ndarray:
    a = np.ones((n, n), dtype=bool)
    np.fill_diagonal(a, False)
    return a


def _ring(n: int) -> np.ndarray:
    a = _empty(n)
    nodes = np.arange(n)
    a[nodes, (nodes + 1) % n] = a[nodes, (nodes - 1) % n] = True
    np.fill_diagonal(a, False)
    return a


def _directed_ring(n: int) -> np.ndarray:
    a = _empty(n)
    nodes = np.arange(n)
    a[nodes, (nodes + 1) % n] = True
    np.fill_diagonal(a, False)
    return a


def _exponential_hops(n: int) -> list[int]:
    """Hops 1, 2, 4, ... smaller than n (the directed exponential graph of SGP)."""
    return [2**k for k in range(max(1, math.ceil(math.log2(n))))] if n > 1 else []


def _exponential(n: int) -> np.ndarray:
    a = _empty(n)
    nodes = np.arange(n)
    for hop in _exponential_hops(n):
        a[nodes, (nodes + hop) % n] = True
    np.fill_diagonal(a, False)
    return a


def _one_peer_exponential(n: int) -> tuple[np.ndarray, ...]:
    phases = []
    nodes = np.arange(n)
    for hop in _exponential_hops(n):
        a = _empty(n)
        a[nodes, (nodes + hop) % n] = True
        np.fill_diagonal(a, False)
        phases.append(a)
    return tuple(phases) or (_empty(n),)


def _erdos_renyi(n: int, p: float | None, seed: int) -> np.ndarray:
    if p is None:
        p = min(1.0, 2.0 * math.log(max(n, 2)) / n)
    if not 0.0 < p <= 1.0:
        raise TopologyError(f"erdos-renyi edge probability must be in (0, 1], got {p}")
    rng = np.random.default_rng(seed)
    for _ in range(1000):
        a = rng.random((n, n)) < p
        np.fill_diagonal(a, False)
        if is_strongly_connected(a):
            return a
    raise TopologyError(
        f"no strongly connected erdos-renyi graph with n={n}, p={p} in 1000 draws; raise p"
    )


def _from_edges(n: int, edges: Sequence[tuple[int, int]]) -> np.ndarray:
    a = _empty(n)
    for edge in edges:
        if len(edge) != 2:
            raise TopologyError(f"an edge is a pair [from, to], got {list(edge)}")
        i, j = int(edge[0]), int(edge[1])
        if not (0 <= i < n and 0 <= j < n):
            raise TopologyError(f"edge {i}->{j} names a node outside 0..{n - 1}")
        if i == j:
            raise TopologyError(f"edge {i}->{j} is a self loop; self weights are implicit")
        a[i, j] = True
    return a


def build_graph(
    name: str,
    n: int,
    *,
    seed: int = 0,
    edges: Sequence[tuple[int, int]] | None = None,
    p: float | None = None,
    require_strongly_connected: bool = True,
) -> Graph:
    """Build a named topology on ``n`` nodes.

    Parameters
    ----------
    name:
        One of :data:`TOPOLOGIES`.
    n:
        Number of nodes (>= 1).
    seed:
        Seed for random topologies (``erdos-renyi``).
    edges:
        ``(from, to)`` pairs for ``name == "edges"``.
    p:
        Edge probability for ``erdos-renyi`` (default ``2 ln(n) / n``).
    require_strongly_connected:
        Refuse graphs (the union over phases) in which some node cannot reach another.

    Raises
    ------
    TopologyError
        For an unknown name, bad arguments or a graph that is not strongly connected.
    """
    if n < 1:
        raise TopologyError(f"a topology needs at least 1 node, got {n}")
    builders: dict[str, Callable[[], tuple[np.ndarray, ...]]] = {
        "complete": lambda: (_complete(n),),
        "ring": lambda: (_ring(n),),
        "directed-ring": lambda: (_directed_ring(n),),
        "exponential": lambda: (_exponential(n),),
        "one-peer-exponential": lambda: _one_peer_exponential(n),
        "erdos-renyi": lambda: (_erdos_renyi(n, p, seed),),
        "edges": lambda: (_from_edges(n, edges or []),),
    }
    if name not in builders:
        raise TopologyError(f"unknown topology '{name}'; choose one of: {', '.join(TOPOLOGIES)}")
    if name == "edges" and not edges:
        raise TopologyError("topology 'edges' needs an edge list (e.g. edges = [[0, 1], [1, 0]])")
    graph = Graph(name=name, phases=builders[name]())
    if require_strongly_connected and not is_strongly_connected(graph.union()):
        raise TopologyError(
            f"topology '{name}' on {n} nodes is not strongly connected: "
            "some agent's updates could never reach another"
        )
    return graph
