"""Gossip algorithms: pure tensor code, no I/O and no clocks."""

import torch

from edge.algorithms.base import Ack, GossipAlgorithm, Payload, ProtocolError
from edge.algorithms.push_sum import PlainPushSum, PushSum

#: Algorithms by the name users pick with ``--algorithm``.
ALGORITHMS: dict[str, type[GossipAlgorithm]] = {
    PushSum.name: PushSum,
    PlainPushSum.name: PlainPushSum,
}


def create_algorithm(name: str, initial: torch.Tensor, *, dtype: torch.dtype) -> GossipAlgorithm:
    """Build the algorithm ``name`` around initial parameters; ``ValueError`` if unknown."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm '{name}'; choose one of: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name](initial, dtype=dtype)


__all__ = [
    "ALGORITHMS",
    "Ack",
    "GossipAlgorithm",
    "Payload",
    "PlainPushSum",
    "ProtocolError",
    "PushSum",
    "create_algorithm",
]
