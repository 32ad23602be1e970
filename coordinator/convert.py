"""Conversion between the edge's :class:`Assignment` and its protobuf form."""

from __future__ import annotations

from edge.topology import Assignment, Phase
from protos import coordinator_pb2


def assignment_to_proto(
    assignment: Assignment, *, ready: bool = True
) -> coordinator_pb2.Assignment:
    return coordinator_pb2.Assignment(
        epoch=assignment.epoch,
        ready=ready,
        peers=[coordinator_pb2.Peer(id=i, address=a) for i, a in assignment.peers.items()],
        schedule=[
            coordinator_pb2.Phase(
                self_weight=phase.self_weight,
                out_edges=[
                    coordinator_pb2.OutEdge(peer_id=p, weight=w)
                    for p, w in phase.out_weights.items()
                ],
                in_neighbours=list(phase.in_neighbours),
            )
            for phase in assignment.schedule
        ],
        lambda2=assignment.lambda2,
    )


def assignment_from_proto(proto: coordinator_pb2.Assignment) -> Assignment:
    """Raise ``ValueError`` for an assignment that is not usable (no phases, bad weights)."""
    if not proto.schedule:
        raise ValueError("assignment has no phases")
    schedule = tuple(
        Phase(
            self_weight=phase.self_weight,
            out_weights={edge.peer_id: edge.weight for edge in phase.out_edges},
            in_neighbours=tuple(phase.in_neighbours),
        )
        for phase in proto.schedule
    )
    return Assignment(
        epoch=proto.epoch,
        peers={peer.id: peer.address for peer in proto.peers},
        schedule=schedule,
        lambda2=proto.lambda2,
    )
