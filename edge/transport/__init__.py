"""Transports: the contract, gRPC server/client, and an in-memory twin."""

from airgossip.edge.transport.base import (
    GossipMessage,
    InboundHandler,
    LinkShaper,
    LinkVerdict,
    MessageHeader,
    RejectCode,
    Rejected,
    SendOutcome,
    Transport,
)
from airgossip.edge.transport.memory import InMemoryNetwork, InMemoryTransport

__all__ = [
    "GossipMessage",
    "InMemoryNetwork",
    "InMemoryTransport",
    "InboundHandler",
    "LinkShaper",
    "LinkVerdict",
    "MessageHeader",
    "RejectCode",
    "Rejected",
    "SendOutcome",
    "Transport",
]
