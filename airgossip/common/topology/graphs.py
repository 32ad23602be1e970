"""Directed neighbour graphs, possibly time-varying, as boolean adjacency matrices.

``adjacency[i, j]`` is True when node ``i`` sends to node ``j``. A time-varying graph is a
periodic sequence of such matrices (its phases); round ``r`` uses phase ``r % period``.

Above :data:`SPARSE_LIMIT` nodes the rings and exponential graphs are built as SciPy sparse
boolean arrays (CSR) instead: a dense phase of 100,000 nodes is 10 GB. :meth:`Graph.edges`
gives the edges of either form as index arrays.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

if TYPE_CHECKING:
    from scipy.sparse import csr_array

TOPOLOGIES = (
    "complete",
    "ring",
    "directed-ring",
    "exponential",
    "one-peer-exponential",
    "erdos-renyi",
    "edges",
)


#: Rings and exponential graphs on more nodes than this are built sparse; up to it, and every
#: other topology at any size, they stay dense as they always were. Callers that index the
#: phases as dense arrays (privacy plans, attacks, the coordinator's policies) keep working
#: up to here; above it a dense phase is 4.3 GB or more, which none of them could hold anyway.
SPARSE_LIMIT = 65_536

#: A phase: a dense ``(n, n)`` boolean array, or a sparse boolean CSR array of that shape.
Adjacency: TypeAlias = "np.ndarray | csr_array"


def issparse(adjacency: object) -> bool:
    """Whether ``adjacency`` is a SciPy sparse array. SciPy is imported only by what builds or
    converts a sparse graph (a dense graph, up to :data:`SPARSE_LIMIT` nodes, never needs
    it: the CLI builds one to check an algorithm before anything heavy is imported), and
    nothing can be sparse before it is."""
    sparse = sys.modules.get("scipy.sparse")
    return sparse is not None and bool(sparse.issparse(adjacency))


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
        One ``(n, n)`` boolean adjacency matrix per phase (dense, or sparse CSR for large
        sparse topologies); no self loops.
    """

    name: str
    phases: tuple[Adjacency, ...]

    @property
    def sparse(self) -> bool:
        """Whether the phases are sparse arrays."""
        return bool(issparse(self.phases[0]))

    @property
    def n(self) -> int:
        return int(self.phases[0].shape[0])

    @property
    def period(self) -> int:
        return len(self.phases)

    def phase(self, round_index: int) -> Adjacency:
        return self.phases[round_index % self.period]

    def edges(self, round_index: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(senders, receivers)`` of a phase's edges, ordered by sender then receiver."""
        return adjacency_edges(self.phase(round_index))

    def out_neighbours(self, node: int, round_index: int = 0) -> list[int]:
        return [int(j) for j in adjacency_row(self.phase(round_index), node)]

    def in_neighbours(self, node: int, round_index: int = 0) -> list[int]:
        return [int(i) for i in adjacency_row(transposed(self.phase(round_index)), node)]

    @property
    def is_undirected(self) -> bool:
        """True when every phase is symmetric (each edge exists both ways)."""
        if self.sparse:
            from scipy.sparse import csr_array

            return all(csr_array(a != a.T).count_nonzero() == 0 for a in self.phases)
        return all(bool((a == a.T).all()) for a in self.phases)

    def union(self) -> Adjacency:
        """Adjacency of the union of all phases."""
        if self.sparse:
            from scipy.sparse import csr_array

            total = self.phases[0]
            for a in self.phases[1:]:
                total = total + a
            return csr_array(total.astype(bool))
        out = np.zeros_like(self.phases[0])
        for a in self.phases:
            out |= a
        return out

    def edge_count(self) -> int:
        if self.sparse:
            from scipy.sparse import csr_array

            return int(sum(csr_array(a).count_nonzero() for a in self.phases))
        return int(sum(int(a.sum()) for a in self.phases))


def adjacency_edges(adjacency: Adjacency) -> tuple[np.ndarray, np.ndarray]:
    """``(senders, receivers)`` of a dense or sparse adjacency, ordered by sender then
    receiver (the order ``np.nonzero`` gives a dense one)."""
    if not issparse(adjacency):
        senders, receivers = np.nonzero(adjacency)
        return senders, receivers
    from scipy.sparse import csr_array

    coo = csr_array(adjacency).tocoo()
    keep = coo.data != 0
    senders, receivers = coo.row[keep].astype(np.int64), coo.col[keep].astype(np.int64)
    order = np.lexsort((receivers, senders))
    return senders[order], receivers[order]


def adjacency_row(adjacency: Adjacency, node: int) -> np.ndarray:
    """The nodes ``node``'s row of a dense or sparse adjacency holds (its out-neighbours; of a
    :func:`transposed` one, its in-neighbours), ascending."""
    if not issparse(adjacency):
        return np.flatnonzero(adjacency[node])
    from scipy.sparse import csr_array

    rows = adjacency if isinstance(adjacency, csr_array) else csr_array(adjacency)
    if not rows.has_sorted_indices:
        rows.sort_indices()
    return np.asarray(rows.indices[rows.indptr[node] : rows.indptr[node + 1]], dtype=np.int64)


def transposed(adjacency: Adjacency) -> Adjacency:
    """The adjacency with its edges reversed: a view of a dense one, a sparse one by rows
    (each node's senders; made anew, so a caller that asks for many nodes keeps it)."""
    if not issparse(adjacency):
        return adjacency.T
    from scipy.sparse import csr_array

    rows = csr_array(adjacency.T)
    rows.sort_indices()
    return rows


def sparse_adjacency(n: int, senders: np.ndarray, receivers: np.ndarray) -> csr_array:
    """A sparse boolean adjacency from edges (duplicates merged, self loops dropped)."""
    from scipy.sparse import csr_array

    keep = senders != receivers
    data = np.ones(int(keep.sum()), dtype=bool)
    a = csr_array((data, (senders[keep], receivers[keep])), shape=(n, n), dtype=bool)
    a.sum_duplicates()
    return a


#: Largest dense graph whose connectivity is walked in numpy (a breadth-first search each
#: way, O(n^2) at most: milliseconds); larger or sparse ones go to SciPy's strong components,
#: whose import alone (about 0.3 s) would otherwise sit on every run's start-up.
DENSE_WALK_LIMIT = 4096


def is_strongly_connected(adjacency: Adjacency) -> bool:
    """Whether every node can reach every other along directed edges."""
    n = adjacency.shape[0]
    if n == 1:
        return True
    if not issparse(adjacency) and n <= DENSE_WALK_LIMIT:
        dense = np.asarray(adjacency, dtype=bool)
        return _reaches_all(dense) and _reaches_all(dense.T)
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import connected_components

    count, _ = connected_components(csr_array(adjacency), directed=True, connection="strong")
    return bool(count == 1)


def _reaches_all(adjacency: np.ndarray) -> bool:
    """Whether node 0 reaches every node along the edges of a dense adjacency."""
    seen = np.zeros(adjacency.shape[0], dtype=bool)
    seen[0] = True
    frontier = seen.copy()
    while frontier.any():
        frontier = adjacency[frontier].any(axis=0) & ~seen
        seen |= frontier
    return bool(seen.all())


def _empty(n: int) -> np.ndarray:
    return np.zeros((n, n), dtype=bool)


def _complete(n: int) -> np.ndarray:
    a = np.ones((n, n), dtype=bool)
    np.fill_diagonal(a, False)
    return a


def _exponential_hops(n: int) -> list[int]:
    """Hops 1, 2, 4, ... smaller than n (the directed exponential graph of SGP)."""
    return [2**k for k in range(max(1, math.ceil(math.log2(n))))] if n > 1 else []


def _hop_phases(name: str, n: int) -> list[list[int]]:
    """The rings' and exponential graphs' phases as hops: node ``i`` sends to ``i + hop``."""
    if name == "ring":
        return [[1, -1]]
    if name == "directed-ring":
        return [[1]]
    if name == "exponential":
        return [_exponential_hops(n)]
    return [[hop] for hop in _exponential_hops(n)] or [[]]  # one-peer-exponential


def _circulant(name: str, n: int) -> tuple[Adjacency, ...]:
    """``name``'s phases from its hops: dense, or sparse above :data:`SPARSE_LIMIT` nodes
    (self loops dropped either way)."""
    nodes = np.arange(n, dtype=np.int64)
    phases: list[Adjacency] = []
    for hops in _hop_phases(name, n):
        if n > SPARSE_LIMIT:
            senders = np.concatenate([nodes for _ in hops] or [nodes[:0]])
            receivers = np.concatenate([(nodes + h) % n for h in hops] or [nodes[:0]])
            phases.append(sparse_adjacency(n, senders, receivers))
            continue
        a = _empty(n)
        for hop in hops:
            a[nodes, (nodes + hop) % n] = True
        np.fill_diagonal(a, False)
        phases.append(a)
    return tuple(phases)


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
    builders: dict[str, Callable[[], tuple[Adjacency, ...]]] = {
        "complete": lambda: (_complete(n),),
        "ring": lambda: _circulant("ring", n),
        "directed-ring": lambda: _circulant("directed-ring", n),
        "exponential": lambda: _circulant("exponential", n),
        "one-peer-exponential": lambda: _circulant("one-peer-exponential", n),
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
