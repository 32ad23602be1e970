"""Transports: the contract, gRPC server/client, and an in-memory twin."""

from edge.transport.base import (
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
from edge.transport.memory import InMemoryNetwork, InMemoryTransport

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
