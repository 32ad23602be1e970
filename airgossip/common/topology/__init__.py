"""Graphs, mixing weights and spectral gap (numpy and scipy).

The names below are loaded on first use (PEP 562): :mod:`airgossip.common.topology.graphs` builds a
dense graph with numpy alone, so the CLI checks an algorithm against its graph before SciPy
(and torch) are imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airgossip.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from airgossip.common.topology.assignment import Assignment, assignments_for_graph, transition
    from airgossip.common.topology.graphs import (
        SPARSE_LIMIT,
        TOPOLOGIES,
        Graph,
        TopologyError,
        adjacency_edges,
        adjacency_row,
        build_graph,
        is_strongly_connected,
        sparse_adjacency,
        transposed,
    )
    from airgossip.common.topology.mixing import (
        Phase,
        column_stochastic,
        metropolis_hastings,
        mixing_lambda2,
        mixing_matrices,
        node_phases,
        second_largest_eigenvalue,
        sparse_mixing_matrices,
        sparse_node_phases,
    )
    from airgossip.common.topology.switching import (
        FleetFigures,
        SwitchingSettings,
        TopologySwitcher,
        consensus_distance,
        fleet_figures,
        parse_switching,
        switched_assignments,
    )

#: Each public name and the module that defines it.
_HOMES = {
    **dict.fromkeys(
        ["Assignment", "assignments_for_graph", "transition"],
        "airgossip.common.topology.assignment",
    ),
    **dict.fromkeys(
        [
            "SPARSE_LIMIT",
            "TOPOLOGIES",
            "Graph",
            "TopologyError",
            "adjacency_edges",
            "adjacency_row",
            "build_graph",
            "is_strongly_connected",
            "sparse_adjacency",
            "transposed",
        ],
        "airgossip.common.topology.graphs",
    ),
    **dict.fromkeys(
        [
            "Phase",
            "column_stochastic",
            "metropolis_hastings",
            "mixing_lambda2",
            "mixing_matrices",
            "node_phases",
            "second_largest_eigenvalue",
            "sparse_mixing_matrices",
            "sparse_node_phases",
        ],
        "airgossip.common.topology.mixing",
    ),
    **dict.fromkeys(
        [
            "FleetFigures",
            "SwitchingSettings",
            "TopologySwitcher",
            "consensus_distance",
            "fleet_figures",
            "parse_switching",
            "switched_assignments",
        ],
        "airgossip.common.topology.switching",
    ),
}


__getattr__ = lazy_exports(__name__, _HOMES)


__all__ = [
    "SPARSE_LIMIT",
    "TOPOLOGIES",
    "Assignment",
    "FleetFigures",
    "Graph",
    "Phase",
    "SwitchingSettings",
    "TopologyError",
    "TopologySwitcher",
    "adjacency_edges",
    "adjacency_row",
    "assignments_for_graph",
    "build_graph",
    "column_stochastic",
    "consensus_distance",
    "fleet_figures",
    "is_strongly_connected",
    "metropolis_hastings",
    "mixing_lambda2",
    "mixing_matrices",
    "node_phases",
    "parse_switching",
    "second_largest_eigenvalue",
    "sparse_adjacency",
    "sparse_mixing_matrices",
    "sparse_node_phases",
    "switched_assignments",
    "transition",
    "transposed",
]
