"""Directed graphs over agent ids, and the edits that keep them strongly connected.

A :class:`FleetGraph` is a :class:`~airgossip.common.topology.Graph` whose node ``i`` is an agent
id; the policies (:mod:`airgossip.coordinator.policy`) edit such graphs as agents come and go:
:func:`splice_out` removes a node and keeps every path that ran through it,
:func:`join_components` chains strongly connected components into one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from airgossip.common.topology import Graph, is_strongly_connected


class FleetGraphJson(TypedDict):
    """A :class:`FleetGraph` as stored: per phase, its ``[from, to]`` id pairs."""

    name: str
    ids: list[str]
    phases: list[list[list[str]]]


@dataclass(frozen=True)
class FleetGraph:
    """A directed graph over agent ids: node ``i`` of ``graph`` is ``ids[i]``."""

    ids: tuple[str, ...]
    graph: Graph

    @property
    def strongly_connected(self) -> bool:
        """Whether every agent's updates reach every other (over all phases)."""
        return is_strongly_connected(self.graph.union()) if self.ids else False

    def edges(self) -> list[list[tuple[str, str]]]:
        """Per phase, the ``(from, to)`` id pairs."""
        return [
            [(self.ids[int(i)], self.ids[int(j)]) for i, j in zip(*np.nonzero(a), strict=True)]
            for a in self.graph.phases
        ]

    def to_json(self) -> FleetGraphJson:
        """The graph as stored."""
        phases = [[[u, v] for u, v in phase] for phase in self.edges()]
        return {"name": self.graph.name, "ids": list(self.ids), "phases": phases}

    @classmethod
    def from_json(cls, data: FleetGraphJson) -> FleetGraph:
        """The graph :meth:`to_json` stored."""
        return from_edges(
            data["name"], data["ids"], [[(u, v) for u, v in p] for p in data["phases"]]
        )


def from_edges(
    name: str, ids: Sequence[str], phases: Sequence[Iterable[tuple[str, str]]]
) -> FleetGraph:
    """Build a :class:`FleetGraph` from per-phase ``(from, to)`` id pairs."""
    index = {agent_id: i for i, agent_id in enumerate(ids)}
    matrices = []
    for pairs in phases or [[]]:
        a = np.zeros((len(ids), len(ids)), dtype=bool)
        for u, v in pairs:
            a[index[u], index[v]] = True
        matrices.append(a)
    return FleetGraph(tuple(ids), Graph(name=name, phases=tuple(matrices)))


def splice_out(adjacency: np.ndarray, node: int) -> None:
    """Remove ``node`` in place, joining each in-neighbour to each out-neighbour.

    Every path that ran through ``node`` survives as a path one hop shorter, so a strongly
    connected graph stays strongly connected on the remaining nodes.
    """
    sources = np.flatnonzero(adjacency[:, node])
    targets = np.flatnonzero(adjacency[node])
    for u in sources:
        for w in targets:
            if u != w:
                adjacency[u, w] = True
    adjacency[node, :] = False
    adjacency[:, node] = False


def join_components(adjacency: np.ndarray, rng: np.random.Generator) -> int:
    """Add edges in place until the graph is strongly connected; return how many were added.

    Components are chained in a cycle (one edge from a random member of each to a random
    member of the next), which makes any digraph strongly connected.
    """
    import networkx as nx

    n = adjacency.shape[0]
    if n <= 1:
        return 0
    graph = nx.from_numpy_array(adjacency.astype(np.int8), create_using=nx.DiGraph)
    components = sorted(sorted(c) for c in nx.strongly_connected_components(graph))
    if len(components) == 1:
        return 0
    for here, there in zip(components, components[1:] + components[:1], strict=True):
        adjacency[int(rng.choice(here)), int(rng.choice(there))] = True
    return len(components)


def restrict(adjacency: np.ndarray, ids: Sequence[str], keep: Sequence[str]) -> np.ndarray:
    """The sub-graph of ``adjacency`` (nodes ``ids``) over ``keep``, in ``keep``'s order."""
    index = [ids.index(agent_id) for agent_id in keep]
    restricted: np.ndarray = adjacency[np.ix_(index, index)].copy()
    return restricted
