"""The transport contract shared by the gRPC and in-memory transports.

A transport moves :class:`GossipMessage` objects (a header plus one encoded flat buffer)
from one agent to another and reports each send's :class:`SendOutcome`. Receiving agents
implement :class:`InboundHandler`: ``admit`` sees only the header (cheap checks, before any
payload is buffered) and ``deliver`` gets the whole message. Either may raise
:class:`Rejected`, which the gRPC transport turns into a status code with the reason.

Link emulation plugs in on the sending side through the small :class:`LinkShaper` protocol,
implemented in ``emulation/``: ``edge`` never imports it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from airgossip.edge.algorithms.base import Ack


class RejectCode(enum.Enum):
    """Why a message was refused; names match gRPC status codes."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"


class Rejected(Exception):
    """A refused message, with a code and a reason meant for the sender's operator.

    ``kind`` is a short fixed label of why (``wrong_receiver``, ``sequence_ahead``...) for
    metrics and rate-limited logs; it never holds text from the message itself. ``sender`` is
    the peer the refusal is charged to when the receiver knows it (an in-neighbour whose
    identity the transport checked), empty otherwise.
    """

    def __init__(self, code: RejectCode, reason: str, *, kind: str = "", sender: str = "") -> None:
        super().__init__(f"{code.value}: {reason}")
        self.code = code
        self.reason = reason
        self.kind = kind or code.value.lower()
        self.sender = sender


@dataclass(frozen=True)
class MessageHeader:
    """Everything about a gossip message except its payload (mirrors the protobuf header)."""

    sender: str
    round: int
    seq: int
    base_seq: int
    algorithm: str
    codec: str
    numel: int
    payload_bytes: int
    scalars: dict[str, float] = field(default_factory=dict)
    fleet_digest: str = ""
    codec_meta: bytes = b""
    receiver: str = ""
    fleet: str = ""
    epoch: int = 0
    lineage: int = 0
    step: int = 0
    steps: int = 0


@dataclass(frozen=True)
class GossipMessage:
    """A header and its encoded payload.

    ``decoded`` is what the receiver would decode from ``data`` (the sender's algorithm
    computed it while encoding): in-process transports pass the object itself, so the
    receiver takes a copy of it instead of decoding the bytes; the bytes are still what is
    counted. It never goes on a wire, and a message without it is decoded as usual.
    """

    header: MessageHeader
    data: bytes | bytearray | memoryview
    decoded: torch.Tensor | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class SendOutcome:
    """What became of one send.

    Attributes
    ----------
    delivered:
        The receiver took the message and acknowledged it.
    wire_bytes:
        Bytes the message occupies on the wire (also counted when a link drops it).
    dropped:
        Link emulation dropped it on the way.
    ack:
        The receiver's acknowledgement when delivered.
    error:
        Refusal or transport failure, when neither delivered nor dropped.
    """

    delivered: bool
    wire_bytes: int
    dropped: bool = False
    ack: Ack | None = None
    error: Rejected | None = None


class InboundHandler(Protocol):
    def accepts(self, sender: str) -> None:
        """Check who is sending before anything is read (with TLS the transport knows it from
        the certificate); raise :class:`Rejected` to refuse."""

    def admit(self, header: MessageHeader) -> None:
        """Check a header before its payload is buffered; raise :class:`Rejected` to refuse."""

    def deliver(self, message: GossipMessage) -> Ack:
        """Take a whole message whose header :meth:`admit` passed; raise :class:`Rejected` to
        refuse it without any state change."""

    def refused(self, error: Rejected) -> None:
        """Note a message the transport itself refused (a malformed stream, say)."""


@dataclass(frozen=True)
class LinkVerdict:
    """The emulated link's decision for one message: drop it, or deliver after a delay."""

    drop: bool = False
    delay_s: float = 0.0


class LinkShaper(Protocol):
    def plan(self, sender: str, receiver: str, round: int, index: int, nbytes: int) -> LinkVerdict:
        """Decide the fate of the ``index``-th message on the directed link sender->receiver."""


SendCallback = Callable[[SendOutcome], None]


class Transport(Protocol):
    def start(self, handler: InboundHandler) -> str:
        """Start receiving for ``handler``; return the address peers should dial."""

    def send(self, peer: str, address: str, message: GossipMessage, done: SendCallback) -> None:
        """Send asynchronously; ``done`` is called exactly once (possibly inline)."""

    def close(self) -> None:
        """Stop receiving and sending; pending sends complete or fail."""
