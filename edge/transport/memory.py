"""An in-memory transport with the gRPC transport's contract, for tests and in-process fleets.

Messages are delivered inline (the receiver's handler runs in the sender's thread), so a
single-threaded driver gets a deterministic fleet. The payload bytes are the encoded bytes
the gRPC transport would stream, and ``wire_bytes`` is counted the same way. Delays from a
link shaper are not slept here (a virtual clock times them); drops are applied.
"""

from __future__ import annotations

import threading

from airgossip.edge.transport.base import (
    GossipMessage,
    InboundHandler,
    LinkShaper,
    RejectCode,
    Rejected,
    SendCallback,
    SendOutcome,
)
from airgossip.edge.transport.wire import wire_bytes


class InMemoryNetwork:
    """Address book of in-memory agents: address -> inbound handler."""

    def __init__(self) -> None:
        self._handlers: dict[str, InboundHandler] = {}
        self._lock = threading.Lock()

    def bind(self, address: str, handler: InboundHandler) -> None:
        with self._lock:
            if address in self._handlers:
                raise ValueError(f"in-memory address {address!r} is already bound")
            self._handlers[address] = handler

    def unbind(self, address: str) -> None:
        with self._lock:
            self._handlers.pop(address, None)

    def lookup(self, address: str) -> InboundHandler | None:
        with self._lock:
            return self._handlers.get(address)


class InMemoryTransport:
    """One agent's endpoint on an :class:`InMemoryNetwork`."""

    def __init__(
        self,
        network: InMemoryNetwork,
        agent_id: str,
        *,
        address: str | None = None,
        shaper: LinkShaper | None = None,
    ) -> None:
        self.network = network
        self.agent_id = agent_id
        self.address = address or f"mem://{agent_id}"
        self.shaper = shaper
        self._counters: dict[str, int] = {}
        self._started = False

    def start(self, handler: InboundHandler) -> str:
        self.network.bind(self.address, handler)
        self._started = True
        return self.address

    def send(self, peer: str, address: str, message: GossipMessage, done: SendCallback) -> None:
        index = self._counters.get(peer, 0)
        self._counters[peer] = index + 1
        nbytes = wire_bytes(message)
        if self.shaper is not None:
            verdict = self.shaper.plan(self.agent_id, peer, message.header.round, index, nbytes)
            if verdict.drop:
                done(SendOutcome(False, nbytes, dropped=True))
                return
        handler = self.network.lookup(address)
        if handler is None:
            error = Rejected(RejectCode.UNAVAILABLE, f"no agent at {address}")
            done(SendOutcome(False, nbytes, error=error))
            return
        try:
            handler.admit(message.header)
            ack = handler.deliver(message)
        except Rejected as err:
            done(SendOutcome(False, nbytes, error=err))
            return
        done(SendOutcome(True, nbytes, ack=ack))

    def close(self) -> None:
        if self._started:
            self.network.unbind(self.address)
            self._started = False
