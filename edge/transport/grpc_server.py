"""The gossip server's ``Push`` method: it checks a push, reassembles its chunks and hands the
message to the agent.

The server protects itself (:mod:`airgossip.edge.transport.guard`): with TLS a push is bound to the
certificate's identity before a byte is read (a sender the agent does not take is refused
at once); at most one push per edge at a time and a bounded number in all, so threads are
left for health checks; a deadline and a progress timeout on every push; requests parsed
from raw bytes (:mod:`airgossip.edge.transport.wire`). Every refusal has its gRPC status and goes to
the handler (metrics and a rate-limited log line), none leaves a traceback. A push offered the
bulk path (:mod:`.bulk`) takes its payload over a data connection of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NoReturn

import grpc

from airgossip.common.security.tls import peer_identity
from airgossip.edge.transport.base import InboundHandler, RejectCode, Rejected
from airgossip.edge.transport.bulk import OFFER_KEY, BulkListener, receive_offered
from airgossip.edge.transport.guard import StreamSlots, StreamWatchdog, Watch, raw_stream_unary
from airgossip.edge.transport.wire import PayloadBuffers, PushAssembler, parse_chunk
from airgossip.protos import gossip_pb2

SERVICE_NAME = "airgossip.v1.Gossip"
#: A push may take its base deadline plus this long per byte announced (64 KiB/s): slow
#: links carry large models, and a client that claims a huge payload is bounded by admit().
SECONDS_PER_BYTE = 1 / (64 << 10)


def _internal(err: Exception) -> Rejected:
    return Rejected(RejectCode.INTERNAL, repr(err)[:240], kind="internal_error")


class GossipServer:
    """The ``Push`` method: checks, reassembles and hands one message to the agent."""

    def __init__(
        self,
        handler: InboundHandler,
        *,
        secure: bool,
        slots: StreamSlots,
        watchdog: StreamWatchdog,
        buffers: PayloadBuffers,
        bulk: BulkListener | None,
    ) -> None:
        self._handler = handler
        self._bulk = bulk
        self._secure = secure
        self._slots = slots
        self._watchdog = watchdog
        self._buffers = buffers

    def _refuse(
        self, context: grpc.ServicerContext, err: Rejected, *, counted: bool = False
    ) -> NoReturn:
        if not counted:
            self._handler.refused(err)
        context.abort(getattr(grpc.StatusCode, err.code.value), err.reason)
        raise AssertionError("context.abort always raises")

    def push(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> gossip_pb2.PushAck:
        identity: str | None = None
        if self._secure:
            identity = peer_identity(context)
            if identity is None:
                self._refuse(context, Rejected(
                    RejectCode.PERMISSION_DENIED,
                    "the client certificate names no airgossip identity", kind="no_identity",
                ))  # fmt: skip
            try:
                self._handler.accepts(identity)  # before a byte is read
            except Rejected as err:
                self._refuse(context, err, counted=True)
        busy = self._slots.acquire(identity)
        if busy is not None:
            what = (
                f"a push from {identity} is already in progress"
                if busy == "busy_edge"
                else "too many pushes in progress"
            )
            self._refuse(context, Rejected(RejectCode.RESOURCE_EXHAUSTED, what, kind=busy))
        slot = [identity]  # what the slot is held under (plaintext: the sender, once known)
        try:
            with self._watchdog.watch(context) as watch:
                try:
                    return self._receive(requests, context, identity, watch, slot)
                except grpc.RpcError:  # the client went away, or the watchdog ended the call
                    if watch.expired is None:
                        raise
                    self._expired(context, watch.expired)
        finally:
            self._slots.release(slot[0])

    def _expired(self, context: grpc.ServicerContext, reason: str) -> NoReturn:
        self._handler.refused(
            Rejected(RejectCode.DEADLINE_EXCEEDED, "the push ran past its time", kind=reason)
        )
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the push ran past its time")
        raise AssertionError("context.abort always raises")

    def _receive(
        self,
        requests: Iterator[bytes],
        context: grpc.ServicerContext,
        identity: str | None,
        watch: Watch,
        slot: list[str | None],
    ) -> gossip_pb2.PushAck:
        try:
            first = next(requests, None)
            if watch.expired is not None:
                self._expired(context, watch.expired)
            watch.progress()
            assembler = PushAssembler(parse_chunk(first) if first is not None else None)
            header = assembler.header
            if identity is not None and header.sender != identity:
                raise Rejected(
                    RejectCode.PERMISSION_DENIED,
                    f"sender {header.sender[:64]!r} is not the certificate's identity {identity!r}",
                    kind="identity_mismatch",
                )
            if identity is None:  # plaintext: the header is all there is to go by
                busy = self._slots.rekey(header.sender)
                if busy is not None:
                    raise Rejected(
                        RejectCode.RESOURCE_EXHAUSTED,
                        f"a push from {header.sender[:64]!r} is already in progress",
                        kind=busy,
                    )
                slot[0] = header.sender
            try:
                self._handler.admit(header)
            except Rejected as err:
                self._refuse(context, err, counted=True)
            except Exception as err:  # a bug an input found: one line, never a traceback
                raise _internal(err) from None
            watch.extend(self._watchdog.deadline_s + header.payload_bytes * SECONDS_PER_BYTE)
            if any(key == OFFER_KEY for key, _ in context.invocation_metadata() or ()):
                receive_offered(
                    self._bulk, context, assembler, identity, self._buffers.take,
                    progress=watch.progress, progress_timeout_s=self._watchdog.progress_timeout_s,
                    time_left=lambda: watch.deadline - watch.clock(),
                )  # fmt: skip
            else:
                assembler.begin(self._buffers.take)
            for raw in requests:
                watch.progress()
                assembler.add(parse_chunk(raw))
            if watch.expired is not None:
                self._expired(context, watch.expired)
            message = assembler.message()
        except Rejected as err:
            self._refuse(context, err)
        try:
            ack = self._handler.deliver(message)
        except Rejected as err:
            self._refuse(context, err, counted=True)
        except Exception as err:  # a bug an input found: one line, never a traceback
            self._refuse(context, _internal(err))
        return gossip_pb2.PushAck(
            round=ack.round, last_seq=ack.last_seq, base_seq=ack.base_seq, absorbed=ack.absorbed,
            lineage=ack.lineage, start_over=ack.start_over,
        )  # fmt: skip

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {"Push": raw_stream_unary(self.push, gossip_pb2.PushAck.SerializeToString)},
        )
