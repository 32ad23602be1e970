"""``airgossip topology``: the figures of a named topology."""

from __future__ import annotations

from typing import Annotated

import typer

from airgossip.cli.display import console, fail


def topology_info(
    name: Annotated[str, typer.Argument(help="Topology name.")],
    agents: Annotated[int, typer.Option(help="Number of nodes.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed for random graphs.")] = 0,
) -> None:
    """Describe a topology: degree, period, connectivity and mixing |λ2|."""
    from edge.topology import TopologyError, build_graph, mixing_matrices, second_largest_eigenvalue

    try:
        graph = build_graph(name, agents, seed=seed)
    except TopologyError as err:
        fail(str(err))
    lam = second_largest_eigenvalue(mixing_matrices(graph))
    degrees = sorted({int(a.sum(axis=1).max()) for a in graph.phases})
    console.print(
        f"{name} on {agents} nodes: {'undirected' if graph.is_undirected else 'directed'}, "
        f"period {graph.period}, max out-degree {max(degrees)}, "
        f"{graph.edge_count() // graph.period} edges per round, |λ2| = {lam:.4f}"
    )
