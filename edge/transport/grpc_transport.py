"""Gossip over real gRPC: a server that reassembles chunked pushes and a client that streams them.

Every agent serves the ``airgossip.v1.Gossip`` service and the standard gRPC health service.
Sends run on a small thread pool, so a slow or dead link never blocks the agent's loop; the
caller keeps at most one message in flight per edge.
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from edge.algorithms.base import Ack
from edge.transport.base import (
    GossipMessage,
    InboundHandler,
    LinkShaper,
    RejectCode,
    Rejected,
    SendCallback,
    SendOutcome,
)
from edge.transport.wire import (
    CHUNK_BYTES,
    MAX_HEADER_BYTES,
    header_from_proto,
    to_chunks,
    wire_bytes,
)
from protos import gossip_pb2, gossip_pb2_grpc

SERVICE_NAME = "airgossip.v1.Gossip"


class PortInUseError(OSError):
    """The address to listen on is taken (or cannot be bound)."""


def ensure_bindable(listen: str) -> None:
    """Raise :class:`PortInUseError` with a plain reason if ``host:port`` cannot be bound.

    gRPC reports a failed bind only as a log line on stderr and a zero port; trying the
    address with a plain socket first gives the user one clear sentence instead.
    """
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_text)
    except ValueError:
        raise PortInUseError(f"cannot listen on {listen}: expected host:port") from None
    if not 0 <= port <= 65535:
        raise PortInUseError(f"cannot listen on {listen}: port must be within 0..65535")
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise PortInUseError(f"cannot listen on {listen}: {err.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As gRPC does: a restarted server may take its port back while connections of the
        # previous one linger in TIME_WAIT; a port someone listens on still fails.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            reason = "the port is in use" if err.errno == errno.EADDRINUSE else err.strerror
            raise PortInUseError(f"cannot listen on {listen}: {reason}") from None


class _GossipServicer(gossip_pb2_grpc.GossipServicer):
    def __init__(self, handler: InboundHandler) -> None:
        self._handler = handler

    def Push(
        self, request_iterator: Iterator[gossip_pb2.PushChunk], context: grpc.ServicerContext
    ) -> gossip_pb2.PushAck:
        def refuse(code: RejectCode, reason: str, *, counted: bool = False) -> NoReturn:
            if not counted:
                self._handler.refused(Rejected(code, reason))
            context.abort(getattr(grpc.StatusCode, code.value), reason)
            raise AssertionError("context.abort always raises")

        first = next(request_iterator, None)
        if first is None or not first.HasField("header"):
            refuse(RejectCode.INVALID_ARGUMENT, "the first chunk of a push must carry the header")
        header = header_from_proto(first.header)
        try:
            self._handler.admit(header)
        except Rejected as err:
            refuse(err.code, err.reason, counted=True)
        total = header.payload_bytes
        buffer = bytearray(total)
        offset = 0
        chunk: gossip_pb2.PushChunk | None = first
        while chunk is not None:
            if chunk is not first and chunk.HasField("header"):
                refuse(RejectCode.INVALID_ARGUMENT, "only the first chunk may carry a header")
            size = len(chunk.data)
            if offset + size > total:
                refuse(
                    RejectCode.INVALID_ARGUMENT,
                    f"chunks carry more than the {total} payload bytes the header announced",
                )
            buffer[offset : offset + size] = chunk.data
            offset += size
            chunk = next(request_iterator, None)
        if offset != total:
            refuse(
                RejectCode.INVALID_ARGUMENT,
                f"stream ended after {offset} of the {total} payload bytes the header announced",
            )
        try:
            ack = self._handler.deliver(GossipMessage(header, buffer))
        except Rejected as err:
            refuse(err.code, err.reason, counted=True)
        return gossip_pb2.PushAck(
            round=ack.round, last_seq=ack.last_seq, base_seq=ack.base_seq, absorbed=ack.absorbed
        )


class GrpcTransport:
    """Gossip server and client of one agent.

    Parameters
    ----------
    agent_id:
        This agent's id (for the link shaper).
    listen:
        ``host:port`` to serve on; port 0 picks a free port.
    shaper:
        Optional link emulation applied to outgoing messages.
    max_workers:
        Threads for serving and for sending, each.
    send_timeout_s:
        Deadline of one push.
    """

    def __init__(
        self,
        agent_id: str,
        *,
        listen: str = "127.0.0.1:0",
        shaper: LinkShaper | None = None,
        max_workers: int = 16,
        send_timeout_s: float = 30.0,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.agent_id = agent_id
        self.listen = listen
        self.shaper = shaper
        self.send_timeout_s = send_timeout_s
        self.chunk_bytes = chunk_bytes
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._health: health.HealthServicer | None = None
        self._senders = futures.ThreadPoolExecutor(max_workers, thread_name_prefix="gossip-send")
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, gossip_pb2_grpc.GossipStub] = {}
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
            maximum_concurrent_rpcs=4 * self._max_workers,
            options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)],
        )
        gossip_pb2_grpc.add_GossipServicer_to_server(_GossipServicer(handler), server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        host = self.listen.rpartition(":")[0]
        ensure_bindable(self.listen)
        try:
            bound = server.add_insecure_port(self.listen)
        except RuntimeError as err:
            raise PortInUseError(f"cannot listen on {self.listen}: {err}") from err
        if bound == 0:
            raise PortInUseError(
                f"cannot listen on {self.listen}: the port is in use or the address is not local"
            )
        server.start()
        for service in ("", SERVICE_NAME):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        self.address = f"{host or '127.0.0.1'}:{bound}"
        return self.address

    # -- sending -----------------------------------------------------------------------------
    def _stub(self, address: str) -> gossip_pb2_grpc.GossipStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                channel = grpc.insecure_channel(
                    address,
                    options=[("grpc.max_send_message_length", self.chunk_bytes + MAX_HEADER_BYTES)],
                )
                self._channels[address] = channel
                stub = self._stubs[address] = gossip_pb2_grpc.GossipStub(channel)
            return stub

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
            call = self._stub(address).Push.future(
                to_chunks(message, self.chunk_bytes), timeout=self.send_timeout_s
            )
            with self._lock:
                self._calls.add(call)
            try:
                reply = call.result()
            finally:
                with self._lock:
                    self._calls.discard(call)
            ack = Ack(reply.last_seq, reply.base_seq, reply.absorbed, reply.round)
            done(SendOutcome(True, nbytes, ack=ack))
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
            reason = err.details() if hasattr(err, "details") else str(err)
            reject = RejectCode.__members__.get(code.name, RejectCode.UNAVAILABLE)
            done(SendOutcome(False, nbytes, error=Rejected(reject, f"{code.name}: {reason}")))
        except grpc.FutureCancelledError:
            closed = Rejected(RejectCode.UNAVAILABLE, "transport closed")
            done(SendOutcome(False, nbytes, error=closed))
        except Exception as err:  # a failing send must never kill the sender pool
            done(SendOutcome(False, nbytes, error=Rejected(RejectCode.UNAVAILABLE, repr(err))))

    def close(self, grace_s: float = 1.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(grace_s).wait()
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
            self._stubs.clear()
