"""Gossip over real gRPC: a server that reassembles chunked pushes and a client that streams them.

Every agent serves the ``airgossip.v1.Gossip`` service and the standard gRPC health check,
over mutual TLS unless told to run in plaintext (``security=None``). Sends run on a small
thread pool, so a slow or dead link never blocks the agent's loop; the caller keeps at most
one message in flight per edge.

The server protects itself (:mod:`airgossip.edge.transport.guard`): with TLS a push is bound to the
certificate's identity before a byte is read (a sender the agent does not take is refused
at once); at most one push per edge at a time and a bounded number in all, so threads are
left for health checks; a deadline and a progress timeout on every push; requests parsed
from raw bytes (:mod:`airgossip.edge.transport.wire`). Every refusal has its gRPC status and goes to
the handler (metrics and a rate-limited log line), none leaves a traceback.

Both ends frame the chunks themselves (:func:`~airgossip.edge.transport.wire.frames`, no serializer
on ``Push``): a chunk leaves as one copy of its slice and arrives as a view of gRPC's bytes copied
once into a reused payload buffer (:class:`~airgossip.edge.transport.wire.PayloadBuffers`); the C
allocator keeps gRPC's megabyte buffers in its heap (:mod:`airgossip.edge.transport.allocator`). A
payload of at least ``bulk_bytes`` (by default 1 MiB in plaintext, 64 MiB over mutual TLS:
:data:`~airgossip.edge.transport.bulk.DEFAULT_BULK_BYTES`) takes a data connection of its own
(:mod:`.bulk`); a receiver without one takes it over the call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import NoReturn, cast

import grpc
from grpc_health.v1 import health_pb2

from airgossip.edge.algorithms.base import Ack
from airgossip.edge.security.tls import TlsCredentials, add_port, dial, peer_identity
from airgossip.edge.transport.allocator import settle_allocator
from airgossip.edge.transport.base import (
    GossipMessage,
    InboundHandler,
    LinkShaper,
    RejectCode,
    Rejected,
    SendCallback,
    SendOutcome,
)
from airgossip.edge.transport.bulk import (
    DEFAULT_BULK_BYTES,
    DEFAULT_BULK_BYTES_TLS,
    OFFER_KEY,
    BulkListener,
    receive_offered,
)
from airgossip.edge.transport.bulk_send import DataPorts, bulk_push
from airgossip.edge.transport.guard import (
    HealthService,
    StreamSlots,
    StreamWatchdog,
    Watch,
    raw_stream_unary,
)
from airgossip.edge.transport.ports import PortInUseError, ensure_bindable
from airgossip.edge.transport.tlssocket import ssl_context
from airgossip.edge.transport.wire import (
    CHUNK_BYTES,
    MAX_HEADER_BYTES,
    PayloadBuffers,
    PushAssembler,
    frames,
    parse_chunk,
    wire_bytes,
)
from airgossip.protos import gossip_pb2

SERVICE_NAME = "airgossip.v1.Gossip"
log = logging.getLogger(__name__)
#: Server threads never given to pushes: health checks and refusals always find one.
RESERVED_THREADS = 4
#: A push may take its base deadline plus this long per byte announced (64 KiB/s): slow
#: links carry large models, and a client that claims a huge payload is bounded by admit().
SECONDS_PER_BYTE = 1 / (64 << 10)


def _internal(err: Exception) -> Rejected:
    return Rejected(RejectCode.INTERNAL, repr(err)[:240], kind="internal_error")


class _GossipServer:
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


class GrpcTransport:
    """Gossip server and client of one agent.

    Parameters
    ----------
    agent_id:
        This agent's id (for the link shaper).
    listen:
        ``host:port`` to serve on; port 0 picks a free port.
    security:
        This agent's TLS credentials; None serves and dials in plaintext (``--insecure``).
    shaper:
        Optional link emulation applied to outgoing messages.
    max_workers:
        Threads for serving and for sending, each.
    send_timeout_s:
        Deadline of one push.
    stream_deadline_s:
        Longest an inbound push may take (plus 1 s per 64 KiB it announces).
    progress_timeout_s:
        Longest an inbound push may go without a chunk (the first one included).
    bulk_bytes:
        Payloads of at least this many bytes are offered the bulk path (:mod:`.bulk`) and a data
        listener serves peers' offers; None:
        :data:`~airgossip.edge.transport.bulk.DEFAULT_BULK_BYTES` in plaintext,
        :data:`~airgossip.edge.transport.bulk.DEFAULT_BULK_BYTES_TLS` over mutual TLS; 0: every
        payload over the call, no data listener, offers answered ``chunks``.
    """

    def __init__(
        self,
        agent_id: str,
        *,
        listen: str = "127.0.0.1:0",
        security: TlsCredentials | None = None,
        shaper: LinkShaper | None = None,
        max_workers: int = 16,
        send_timeout_s: float = 30.0,
        chunk_bytes: int = CHUNK_BYTES,
        stream_deadline_s: float = 60.0,
        progress_timeout_s: float = 10.0,
        bulk_bytes: int | None = None,
    ) -> None:
        settle_allocator()  # before gRPC's threads start allocating
        self.agent_id, self.listen = agent_id, listen
        self.security = security
        self.shaper = shaper
        self.send_timeout_s = send_timeout_s
        self.chunk_bytes = chunk_bytes
        #: Payload bytes from which a push takes the bulk path; 0: never.
        default = DEFAULT_BULK_BYTES if security is None else DEFAULT_BULK_BYTES_TLS
        self.bulk_bytes = default if bulk_bytes is None else bulk_bytes
        if self.bulk_bytes < 0:
            raise ValueError(f"bulk_bytes must be 0 (off) or positive, got {bulk_bytes}")
        self._bulk: BulkListener | None = None
        self.data_ports = DataPorts()  # data connections kept, peers whose port failed
        self._client_tls = (
            ssl_context(security, server=False) if security and self.bulk_bytes else None
        )
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._health: HealthService | None = None
        self._watchdog = StreamWatchdog(
            deadline_s=stream_deadline_s, progress_timeout_s=progress_timeout_s
        )
        self.slots = StreamSlots(max_workers - min(RESERVED_THREADS, max_workers // 2))
        #: Where inbound payloads are received (reused once the agent let go of them).
        self.buffers = PayloadBuffers()
        self._senders = futures.ThreadPoolExecutor(max_workers, thread_name_prefix="gossip-send")
        self._channels: dict[tuple[str, str], grpc.Channel] = {}
        self._pushes: dict[tuple[str, str], grpc.StreamUnaryMultiCallable] = {}
        self._counters: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._closing = threading.Event()
        self._calls: set[grpc.Future] = set()
        self.address = ""

    # -- receiving ---------------------------------------------------------------------------
    def start(self, handler: InboundHandler) -> str:
        limit = self.chunk_bytes + MAX_HEADER_BYTES
        server = grpc.server(
            futures.ThreadPoolExecutor(self._max_workers, thread_name_prefix="gossip-recv"),
            # Calls beyond this are refused by gRPC itself; ours are refused in microseconds
            # (StreamSlots), so the bound is only ever reached by a flood.
            maximum_concurrent_rpcs=16 * self._max_workers,
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.so_reuseport", 0),
                ("grpc.max_concurrent_streams", 16),  # per connection
                ("grpc.server_handshake_timeout_ms", 10_000),
                ("grpc.max_connection_idle_ms", 300_000),
            ],
        )
        host = self.listen.rpartition(":")[0]
        ensure_bindable(self.listen)
        try:
            bound = add_port(server, self.listen, self.security)
        except RuntimeError as err:
            raise PortInUseError(f"cannot listen on {self.listen}: {err}") from err
        if bound == 0:
            raise PortInUseError(
                f"cannot listen on {self.listen}: the port is in use or the address is not local"
            )
        if self.bulk_bytes:  # once the gossip port is ours: nothing to undo
            self._bulk = BulkListener(host, self.security, handler.refused)
        gossip = _GossipServer(
            handler,
            secure=self.security is not None,
            slots=self.slots,
            watchdog=self._watchdog,
            buffers=self.buffers,
            bulk=self._bulk,
        )
        self._health = HealthService()
        server.add_generic_rpc_handlers((gossip.handler(), self._health.handler()))
        server.start()
        for service in ("", SERVICE_NAME):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        self.address = f"{host or '127.0.0.1'}:{bound}"
        return self.address

    # -- sending -----------------------------------------------------------------------------
    def _push(self, peer: str, address: str) -> grpc.StreamUnaryMultiCallable:
        """``Push`` to ``peer``, sending chunks as the bytes :func:`frames` made (no
        serializer: gRPC takes them as they are)."""
        key = (peer, address)
        with self._lock:
            push = self._pushes.get(key)
            if push is None:
                limit = ("grpc.max_send_message_length", self.chunk_bytes + MAX_HEADER_BYTES)
                channel = dial(address, peer, self.security, [limit])
                self._channels[key] = channel
                push = self._pushes[key] = channel.stream_unary(
                    f"/{SERVICE_NAME}/Push",
                    request_serializer=None,
                    response_deserializer=gossip_pb2.PushAck.FromString,
                )
            return push

    def send(self, peer: str, address: str, message: GossipMessage, done: SendCallback) -> None:
        with self._lock:
            index = self._counters.get(peer, 0)
            self._counters[peer] = index + 1
            if self._closed:
                done(SendOutcome(False, 0, error=Rejected(RejectCode.UNAVAILABLE, "closed")))
                return
        self._senders.submit(self._send_now, peer, address, message, index, done)

    def _send_now(
        self, peer: str, address: str, message: GossipMessage, index: int, done: SendCallback
    ) -> None:
        nbytes = wire_bytes(message, self.chunk_bytes)
        try:
            if self.shaper is not None:
                verdict = self.shaper.plan(self.agent_id, peer, message.header.round, index, nbytes)
                if verdict.delay_s > 0 and self._closing.wait(verdict.delay_s):
                    closed = Rejected(RejectCode.UNAVAILABLE, "transport closed")
                    done(SendOutcome(False, nbytes, error=closed))  # woken by close()
                    return
                if verdict.drop:
                    done(SendOutcome(False, nbytes, dropped=True))
                    return
            push, timeout, chunk = self._push(peer, address), self.send_timeout_s, self.chunk_bytes

            def plain() -> grpc.Future:
                return self._track(push.future(frames(message, chunk), timeout=timeout))

            if not self.bulk_bytes or len(message.data) < self.bulk_bytes:
                reply = self._settle(plain())
            else:
                reply = bulk_push(
                    lambda offer: self._track(push.future(
                        offer.requests(), timeout=timeout, metadata=((OFFER_KEY, "offer"),)
                    )), self._settle, message, plain=plain, chunk_bytes=chunk, timeout_s=timeout,
                    address=address, peer=peer, context=self._client_tls,
                    ports=self.data_ports,
                )  # fmt: skip
            ack = Ack(
                reply.last_seq, reply.base_seq, reply.absorbed, reply.round, reply.lineage,
                start_over=reply.start_over,
            )  # fmt: skip
            done(SendOutcome(True, nbytes, ack=ack))
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
            reason = err.details() if hasattr(err, "details") else str(err)
            # A push that ran out of time (ours or the receiver's) counts as an unreachable
            # peer; every other code is the receiver's answer.
            reject = (
                RejectCode.UNAVAILABLE
                if code == grpc.StatusCode.DEADLINE_EXCEEDED
                else RejectCode.__members__.get(code.name, RejectCode.UNAVAILABLE)
            )
            done(SendOutcome(False, nbytes, error=Rejected(reject, f"{code.name}: {reason}")))
        except Rejected as err:  # the bulk path's data connection failed
            done(SendOutcome(False, nbytes, error=err))
        except grpc.FutureCancelledError:
            closed = Rejected(RejectCode.UNAVAILABLE, "transport closed")
            done(SendOutcome(False, nbytes, error=closed))
        except Exception as err:  # a failing send must never kill the sender pool
            done(SendOutcome(False, nbytes, error=Rejected(RejectCode.UNAVAILABLE, repr(err))))

    def _track(self, call: grpc.Future) -> grpc.Future:
        with self._lock:
            self._calls.add(call)
        return call

    def _settle(self, call: grpc.Future) -> gossip_pb2.PushAck:
        try:
            return cast(gossip_pb2.PushAck, call.result())
        finally:
            with self._lock:
                self._calls.discard(call)

    def close(self, grace_s: float = 1.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(grace_s).wait()
        self._watchdog.close()
        if self._bulk is not None:
            self._bulk.close()
        self.data_ports.close()
        # Pushes still in flight (a slow link, a peer that froze) are cancelled, not awaited.
        self._closing.set()
        with self._lock:
            calls = list(self._calls)
        for call in calls:
            call.cancel()
        self._senders.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._pushes.clear()
