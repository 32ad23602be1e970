"""An agent's view of the fleet: who its peers are and its mixing weights per phase."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from airgossip.common.topology.graphs import Graph
from airgossip.common.topology.mixing import (
    DENSE_LIMIT,
    Phase,
    mixing_matrices,
    node_phases,
    second_largest_eigenvalue,
    sparse_mixing_matrices,
    sparse_node_phases,
)


@dataclass(frozen=True)
class Assignment:
    """What an agent needs to gossip: a peer directory and its column of W per phase.

    Attributes
    ----------
    epoch:
        Increases whenever the graph changes.
    peers:
        ``{peer_id: address}`` of every agent this one may hear from or send to.
    schedule:
        One :class:`Phase` per phase of a periodic graph; round ``r`` uses
        ``schedule[r % len(schedule)]``.
    lambda2:
        Second-largest |eigenvalue| of the fleet's mixing matrix over one period (NaN if
        unknown).
    """

    epoch: int
    peers: dict[str, str]
    schedule: tuple[Phase, ...]
    lambda2: float = math.nan

    def phase(self, round_index: int) -> Phase:
        return self.schedule[round_index % len(self.schedule)]


def assignments_for_graph(
    graph: Graph,
    addresses: dict[str, str],
    *,
    epoch: int = 1,
    scheme: str = "column-stochastic",
) -> dict[str, Assignment]:
    """Every node's :class:`Assignment`; node ``i`` is the ``i``-th id of ``addresses``.

    Each agent's directory holds its in- and out-neighbours over all phases. Above
    :data:`~airgossip.common.topology.mixing.DENSE_LIMIT` nodes the weights are sparse matrices and
    ``lambda2`` is solved iteratively: linear in the edges, no n x n array.
    """
    ids = list(addresses)
    if len(ids) != graph.n:
        raise ValueError(f"{len(ids)} agents for a graph on {graph.n} nodes")
    position = {agent_id: k for k, agent_id in enumerate(ids)}
    phases: Callable[[int], list[Phase]]
    if graph.n <= DENSE_LIMIT:
        matrices = mixing_matrices(graph, scheme)
        lambda2 = second_largest_eigenvalue(matrices)

        def phases(node: int) -> list[Phase]:
            return node_phases(graph, ids, node, scheme, matrices=matrices)
    else:
        sparse = sparse_mixing_matrices(graph, scheme)
        lambda2 = second_largest_eigenvalue(sparse)
        pairs = tuple((w, w.tocsr()) for w in sparse)

        def phases(node: int) -> list[Phase]:
            return sparse_node_phases(pairs, ids, node)

    result = {}
    for node, agent_id in enumerate(ids):
        schedule = tuple(phases(node))
        known = {p for phase in schedule for p in (*phase.out_weights, *phase.in_neighbours)}
        peers = {p: addresses[p] for p in sorted(known, key=position.__getitem__)}
        result[agent_id] = Assignment(epoch, peers, schedule, lambda2)
    return result


def transition(old: Assignment, new: Assignment) -> Assignment:
    """``new``, with ``old``'s peers still known, for switching graphs during a run.

    An agent only accepts messages from peers in its directory. Keeping the old peers for the
    transition lets edges that leave the graph deliver what they still owe (push-sum's
    undelivered weight, unacknowledged blocks of shared-copy algorithms), so a switch on
    lossy links stays exact. Drop them with a later assignment once nothing is owed.
    """
    return Assignment(new.epoch, {**old.peers, **new.peers}, new.schedule, new.lambda2)
