"""What an algorithm asks of its gossip graph, torch-free.

Read by the algorithms themselves (:attr:`GossipAlgorithm.supports_directed`), by the
networks that check a run's graph and by the CLI's early check, which answers
``--algorithm dpsgd`` on a directed graph before torch is imported.
"""

from __future__ import annotations

#: Algorithms whose mixing needs every edge both ways (symmetric, Metropolis-Hastings
#: weights, or clipping a pull around a neighbour's own): they refuse a directed graph.
UNDIRECTED_ONLY: frozenset[str] = frozenset(
    {"dpsgd", "dpsgd-ac", "choco", "clipped-gossip", "cs-plus-gossip"}
)


def supports_directed(algorithm: str) -> bool:
    """Whether ``algorithm`` runs on directed graphs (column-stochastic weights suffice)."""
    return algorithm not in UNDIRECTED_ONLY


def directed_graph_refusal(algorithm: str, topology: str) -> str:
    """Why ``algorithm`` cannot run on ``topology``, a directed graph."""
    return (
        f"algorithm '{algorithm}' needs an undirected graph; topology '{topology}' is directed "
        "(use ring, complete, or a symmetric edge list)"
    )
