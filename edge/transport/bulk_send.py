"""The bulk path, the sender's side (see :mod:`airgossip.edge.transport.bulk` for the whole path).

A push of a large payload offers the bulk path and streams its header alone; the
receiver's answer (its data port, a one-time token and where to start) arrives in the
call's initial metadata; the payload goes from the flat buffer's own memory over the data
connection (mutual TLS on the same certificates where the fleet has TLS), which stays open
for the next push to the same receiver (:class:`DataPorts`). A push whose data connection
was cut is offered again, and the receiver, which kept what arrived, says where to go on
(:func:`bulk_push`).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from airgossip.edge.transport.base import GossipMessage, RejectCode, Rejected
from airgossip.edge.transport.bulk import CHUNKS, OFFER_KEY, RESUME_KEY, TOKEN_BYTES
from airgossip.edge.transport.tlssocket import ssl_identity
from airgossip.edge.transport.wire import data_frames, frames
from airgossip.protos import gossip_pb2

#: Attempts of one push on the bulk path (the first and its resumptions), and the pause
#: before each resumption (the receiver must first notice the cut and let go of the edge).
ATTEMPTS = 3
RESUME_PAUSE_S = 0.25
#: Longest wait for a data connection to open (a port a firewall drops), and how long a
#: peer whose data port could not be reached gets its pushes over the call instead.
CONNECT_TIMEOUT_S = 5.0
UNREACHABLE_S = 60.0
#: How long a data connection is kept open after its push for the next one to the same
#: receiver (shorter than the receiver keeps it: :data:`airgossip.edge.transport.bulk.IDLE_S`), and
#: how many are kept for one receiver.
IDLE_S = 30.0
IDLE_PER_PEER = 2

#: Where a receiver's data listener is: host, port, the identity it must prove.
Target = tuple[str, int, str]


class DataPortUnreachable(ConnectionError):
    """The data connection could not be opened (nothing of the payload was sent)."""


class DataPorts:
    """One sender's view of its receivers' data ports: the data connections its pushes
    left open (each reused by the next push to the same receiver within :data:`IDLE_S`,
    which saves a connection and a TLS handshake a push), and the peers (gossip address,
    identity) whose data port it could not reach, each until :data:`UNREACHABLE_S` after
    it failed: their pushes go over the call."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[tuple[str, str], float] = {}
        self._open: dict[Target, list[tuple[float, socket.socket]]] = {}
        self._closed = False

    def take(self, target: Target) -> socket.socket | None:
        """A connection to ``target`` left open by an earlier push, still good; or None."""
        while True:
            with self._lock:
                kept = self._open.get(target)
                if not kept:
                    return None
                since, sock = kept.pop()
            if self._clock() - since < IDLE_S and _still_open(sock):
                return sock
            sock.close()

    def give(self, target: Target, sock: socket.socket) -> None:
        """Keep ``sock`` (its push went through) for the next push to ``target``."""
        with self._lock:
            kept = self._open.setdefault(target, [])
            if not self._closed and len(kept) < IDLE_PER_PEER:
                kept.append((self._clock(), sock))
                return
        sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            kept, self._open = [s for k in self._open.values() for _, s in k], {}
        for sock in kept:
            sock.close()

    def reachable(self, address: str, peer: str) -> bool:
        """Whether pushes to ``peer`` at ``address`` may be offered the bulk path now."""
        with self._lock:
            return self._until.get((address, peer), 0.0) < self._clock()

    def failed(self, address: str, peer: str) -> None:
        with self._lock:
            self._until[(address, peer)] = self._clock() + UNREACHABLE_S


def parse_answer(answer: str) -> tuple[int, bytes, int] | None:
    """The port, token and resume offset of a receiver's answer; None for ``chunks``;
    ValueError if bent."""
    if answer == CHUNKS:
        return None
    port_text, token_hex, start_text = answer.split(" ")
    port, token, start = int(port_text), bytes.fromhex(token_hex), int(start_text)
    if not 0 < port < 65536 or len(token) != TOKEN_BYTES or start < 0:
        raise ValueError(f"a bulk answer must be PORT TOKEN START, not {answer[:80]!r}")
    return port, token, start


def _still_open(sock: socket.socket) -> bool:
    """Whether a kept connection is still open: nothing to read but what TLS keeps to
    itself (a session ticket), no end of stream from the receiver."""
    sock.setblocking(False)
    try:
        # Each TLS record read (a ticket) may end a call with "want read": a few calls
        # reach what follows it.
        for _ in range(4):
            try:
                sock.recv(1)  # b"" ends the stream; data here is out of turn
                return False
            except ssl.SSLWantReadError:
                continue
            except BlockingIOError:
                return True
            except OSError:
                return False
        return True
    finally:
        sock.setblocking(True)


def send_payload(
    host: str,
    port: int,
    token: bytes,
    data: memoryview,
    *,
    peer: str,
    context: ssl.SSLContext | None,
    timeout_s: float,
    ports: DataPorts | None = None,
) -> socket.socket:
    """Send the token, ``data`` from its own memory and the token again over a connection
    to a receiver's data listener: one left open by an earlier push (from ``ports``) or a
    new one. With TLS the receiver's certificate must name ``peer``. Returns the
    connection, open (the caller keeps it once the push is acknowledged, or closes it)."""
    sock = ports.take((host, port, peer)) if ports is not None else None
    if sock is None:
        sock = _connect(host, port, peer=peer, context=context, timeout_s=timeout_s)
    try:
        sock.settimeout(timeout_s)
        sock.sendall(token)
        sock.sendall(data)
        sock.sendall(token)  # the end of the payload: the receiver checks it
    except BaseException:
        sock.close()
        raise
    return sock


def _connect(
    host: str, port: int, *, peer: str, context: ssl.SSLContext | None, timeout_s: float
) -> socket.socket:
    try:
        sock = socket.create_connection(
            (host.strip("[]"), port), timeout=min(timeout_s, CONNECT_TIMEOUT_S)
        )
    except OSError as err:
        raise DataPortUnreachable(
            f"cannot open a data connection to {host}:{port}: {err}"
        ) from None
    try:
        sock.settimeout(timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None:
            sock = context.wrap_socket(sock)
            named = ssl_identity(sock)
            if named != peer:
                raise ConnectionError(f"the data listener names {named!r}, not {peer!r}")
    except BaseException:
        sock.close()
        raise
    return sock


class BulkOffer:
    """The sender's side of one push offered the bulk path.

    :meth:`requests` is the call's request stream: the header alone, then (once
    :meth:`complete` knows the answer) nothing, or the payload's chunks where the receiver
    answered ``chunks``. :meth:`complete` reads the answer from the call's initial metadata
    and sends the payload over the data connection; whatever happens it lets the stream end.
    """

    def __init__(self, message: GossipMessage, chunk_bytes: int, timeout_s: float) -> None:
        self._message = message
        self._chunk_bytes = chunk_bytes
        self._timeout_s = timeout_s
        self._answered = threading.Event()
        self._over_chunks = False
        #: Where the receiver asked the payload to start (> 0: a cut push resumed).
        self.resumed_at = 0
        #: The data connection the payload went over, and where it leads (kept for the
        #: next push once this one is acknowledged: :meth:`finish`).
        self.connection: socket.socket | None = None
        self._target: Target | None = None

    def requests(self) -> Iterator[bytes]:
        yield next(frames(GossipMessage(self._message.header, b"")))
        if self._answered.wait(self._timeout_s) and self._over_chunks:
            yield from data_frames(memoryview(self._message.data).cast("B"), self._chunk_bytes)

    def complete(
        self,
        call: grpc.Future,
        host: str,
        peer: str,
        context: ssl.SSLContext | None,
        ports: DataPorts | None = None,
    ) -> None:
        """Send the payload as the receiver answered; :class:`Rejected` (``UNAVAILABLE``,
        the call cancelled) if the data connection fails."""
        try:
            metadata = call.initial_metadata() or ()
            answer = dict(metadata).get(OFFER_KEY)
            if answer is None:
                return  # the call ended first: its status says why
            target = parse_answer(str(answer))
            if target is None:
                self._over_chunks = True
                return
            port, token, start = target
            data = memoryview(self._message.data).cast("B")
            if start > len(data):
                raise ValueError(f"the receiver asks to resume at {start} of {len(data)} bytes")
            self.resumed_at = start
            self._target = (host, port, peer)
            self.connection = send_payload(
                host, port, token, data[start:], peer=peer, context=context,
                timeout_s=self._timeout_s, ports=ports,
            )  # fmt: skip
        except (OSError, ValueError, ssl.SSLError) as err:
            call.cancel()
            raise Rejected(
                RejectCode.UNAVAILABLE,
                f"data connection to {peer} failed: {type(err).__name__}: {str(err)[:160]}",
                kind="bulk_unreachable" if isinstance(err, DataPortUnreachable) else "bulk_failed",
            ) from None
        finally:
            self._answered.set()

    def finish(self, ports: DataPorts, acknowledged: bool) -> None:
        """The push is over: its data connection kept in ``ports`` if it was acknowledged,
        closed if not."""
        sock, self.connection = self.connection, None
        if sock is not None and self._target is not None and acknowledged:
            ports.give(self._target, sock)
        elif sock is not None:
            sock.close()


def bulk_push(
    call_for: Callable[[BulkOffer], grpc.Future],
    settle: Callable[[grpc.Future], gossip_pb2.PushAck],
    message: GossipMessage,
    *,
    plain: Callable[[], grpc.Future],
    chunk_bytes: int,
    timeout_s: float,
    address: str,
    peer: str,
    context: ssl.SSLContext | None,
    ports: DataPorts,
) -> gossip_pb2.PushAck:
    """One push on the bulk path, resumed (up to :data:`ATTEMPTS` in all) when its data
    connection was cut: the receiver keeps what arrived and answers the next offer of the
    same header with where to go on. ``call_for(offer)`` starts the call, ``settle(call)``
    waits for its reply. Where the data port cannot be reached (a firewall, a service that
    forwards the gossip port alone), the push goes over the call (``plain()``), and so do
    that peer's next pushes for :data:`UNREACHABLE_S` (kept in ``ports``)."""
    if not ports.reachable(address, peer):
        return _over_the_call(plain, settle)
    host = address.rpartition(":")[0]
    for attempt in range(ATTEMPTS):
        offer = BulkOffer(message, chunk_bytes, timeout_s)
        call = call_for(offer)
        acknowledged = False
        try:
            try:
                offer.complete(call, host, peer, context, ports)
            except Rejected:
                with contextlib.suppress(grpc.RpcError, grpc.FutureCancelledError):
                    settle(call)
                raise
            reply = settle(call)
            acknowledged = True
            return reply
        except (Rejected, grpc.RpcError) as err:
            if isinstance(err, Rejected) and err.kind == "bulk_unreachable":
                ports.failed(address, peer)
                return _over_the_call(plain, settle)
            if attempt + 1 == ATTEMPTS or not _resumable(err, attempt):
                raise
        finally:
            offer.finish(ports, acknowledged)
        time.sleep(RESUME_PAUSE_S * (attempt + 1))
    raise AssertionError("unreachable")


def _over_the_call(
    plain: Callable[[], grpc.Future], settle: Callable[[grpc.Future], gossip_pb2.PushAck]
) -> gossip_pb2.PushAck:
    """The push over the call, again if the receiver still holds the edge for an offer
    just given up."""
    for attempt in range(ATTEMPTS):
        try:
            return settle(plain())
        except grpc.RpcError as err:
            if attempt + 1 == ATTEMPTS or err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        time.sleep(RESUME_PAUSE_S * (attempt + 1))
    raise AssertionError("unreachable")


def _resumable(err: Rejected | grpc.RpcError, attempt: int) -> bool:
    """Whether another offer may resume the push: our data connection failed, the receiver
    kept what arrived, or (after a cut) it still holds the edge."""
    if isinstance(err, Rejected):
        return err.kind == "bulk_failed"
    trailing = dict(getattr(err, "trailing_metadata", lambda: ())() or ())
    busy = attempt > 0 and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return RESUME_KEY in trailing or busy
