"""Gossip over real gRPC: a client that streams chunked pushes, and the server
(:mod:`.grpc_server`) that reassembles them.

Every agent serves the ``airgossip.v1.Gossip`` service and the standard gRPC health check,
over mutual TLS unless told to run in plaintext (``security=None``). Sends run on a small
thread pool, so a slow or dead link never blocks the agent's loop; the caller keeps at most
one message in flight per edge.

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
from concurrent import futures
from typing import cast

import grpc
from grpc_health.v1 import health_pb2

from airgossip.common.ports import PortInUseError, ensure_bindable
from airgossip.common.security.tls import TlsCredentials, add_port, dial
from airgossip.edge.algorithms.base import Ack
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
)
from airgossip.edge.transport.bulk_send import DataPorts, bulk_push
from airgossip.edge.transport.grpc_server import SERVICE_NAME, GossipServer
from airgossip.edge.transport.guard import HealthService, StreamSlots, StreamWatchdog
from airgossip.edge.transport.tlssocket import ssl_context
from airgossip.edge.transport.wire import (
    CHUNK_BYTES,
    MAX_HEADER_BYTES,
    PayloadBuffers,
    frames,
    wire_bytes,
)
from airgossip.protos import gossip_pb2

log = logging.getLogger(__name__)
#: Server threads never given to pushes: health checks and refusals always find one.
RESERVED_THREADS = 4


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
        gossip = GossipServer(
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
