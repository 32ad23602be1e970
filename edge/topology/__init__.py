"""Graphs, mixing weights and spectral gap (numpy and scipy)."""

from edge.topology.assignment import Assignment, assignments_for_graph, transition
from edge.topology.graphs import (
    SPARSE_LIMIT,
    TOPOLOGIES,
    Graph,
    TopologyError,
    adjacency_edges,
    build_graph,
    is_strongly_connected,
)
from edge.topology.mixing import (
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
from edge.topology.switching import (
    FleetFigures,
    SwitchingSettings,
    TopologySwitcher,
    consensus_distance,
    fleet_figures,
    parse_switching,
    switched_assignments,
)

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
    "sparse_mixing_matrices",
    "sparse_node_phases",
    "switched_assignments",
    "transition",
]
