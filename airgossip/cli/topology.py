"""``airgossip topology``: the figures of a named topology, or of a coordinator's policy."""

from __future__ import annotations

from typing import Annotated

import typer

from airgossip.cli.display import fail, say


def topology_info(
    name: Annotated[str, typer.Argument(show_default=False)],
    agents: Annotated[int, typer.Option(help="Number of nodes.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed for random graphs.")] = 0,
    out_degree: Annotated[int, typer.Option(help="Out-neighbours per agent for k-out.")] = 2,
) -> None:
    """Describe a topology: degree, period, connectivity and mixing |λ2|.

    NAME is one of {named_topologies}, or the coordinator's k-out (its first graph).
    """
    from airgossip.common.identity import agent_ids
    from airgossip.common.topology import (
        Graph,
        TopologyError,
        build_graph,
        mixing_matrices,
        second_largest_eigenvalue,
    )
    from airgossip.coordinator.policy import POLICIES, TopologySpec, make_policy

    if name == "edges":
        fail("topology 'edges' is an explicit edge list: give it in a scenario file")
    if name not in POLICIES:
        named = ", ".join(p for p in POLICIES if p != "edges")
        fail(f"unknown topology '{name}'; choose one of: {named}")
    if agents < 1:
        fail(f"--agents must be at least 1, got {agents}")
    if out_degree < 1:
        fail(f"--out-degree must be at least 1, got {out_degree}")
    try:
        graph: Graph
        if name == "k-out":
            policy = make_policy(TopologySpec("k-out", seed=seed, out_degree=out_degree))
            graph = policy.graph(tuple(agent_ids(agents)), None, 1).graph
        else:
            graph = build_graph(name, agents, seed=seed)
    except TopologyError as err:
        fail(str(err))
    lam = second_largest_eigenvalue(mixing_matrices(graph))
    degrees = sorted({int(a.sum(axis=1).max()) for a in graph.phases})
    say(
        f"{name} on {agents} nodes: {'undirected' if graph.is_undirected else 'directed'}, "
        f"period {graph.period}, max out-degree {max(degrees)}, "
        f"{graph.edge_count() // graph.period} edges per round, |λ2| = {lam:.4f}"
        + (" (the coordinator's first graph; it is rewired as agents come and go)"
           if name == "k-out" else "")
    )  # fmt: skip
