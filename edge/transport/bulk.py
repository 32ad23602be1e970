"""The bulk path: a push's payload over a data connection of its own, its control over gRPC.

A push over gRPC moves its payload through gRPC's own copies and thread hand-offs (five
user-space copies of every byte, see ``docs/performance.md``). On the bulk path the ``Push``
call keeps everything but the payload's bytes: the sender offers the bulk path in the
call's metadata (:data:`OFFER_KEY`) and streams the header alone; the receiver checks it
(identity, ``admit``, sizes) exactly as for any push, takes the payload buffer, and answers
in the call's initial metadata with the port of its data listener and a one-time token.
The sender connects (or takes the data connection its last push to that receiver left
open), sends the token, the payload straight from the flat buffer (``sendall`` of the
tensor's own memory) and the token again, and ends its request stream; the receiver reads
it in with ``recv_into`` into the buffer already allocated (no other copy, memory bounded
by the payload), checks that exactly the announced bytes came, closed by the token, and
only then delivers the message and acknowledges it on the gRPC call: a refusal is the
call's status, as ever, and a push whose data ended short, ran over or stalled is refused
whole, never absorbed. A connection that carried a push whole stays open for the same
sender's next push (:meth:`BulkListener.keep`): one TLS handshake per pair of agents, not
per push. What a cut push received is kept (:class:`Partials`) and the sender's next offer
of the same header goes on from there (:func:`airgossip.edge.transport.bulk_send.bulk_push`).

The data connection is authenticated as the call is: with TLS by mutual TLS on the same
certificates (Python's :mod:`ssl`), its identity that of the call; in plaintext
(``--insecure``) by the token alone (128 random bits, single use, valid while the call
waits). A connection with no valid token, of another identity or that does not finish its
handshake in time is closed and counted as a refusal.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from airgossip.common.security.tls import TlsCredentials
from airgossip.edge.transport.base import MessageHeader, RejectCode, Rejected
from airgossip.edge.transport.tlssocket import ssl_context, ssl_identity
from airgossip.edge.transport.wire import PushAssembler

log = logging.getLogger(__name__)

#: Metadata key of the offer (the sender's ``offer``) and of the answer (the receiver's
#: ``PORT TOKEN`` hex, or ``chunks``: send the payload over the call as usual).
OFFER_KEY = "airgossip-bulk"
#: Payload bytes from which a push takes the bulk path unless told otherwise, in plaintext
#: and over mutual TLS (measured: ``python -m benchmarks --only bulk-threshold``,
#: docs/performance.md). In plaintext it is faster from about 1 MiB; over TLS Python's
#: ``ssl`` costs what gRPC's copies cost, so it is no faster at any size, and it is taken
#: for large models only, for what else it gives them (the receiver's memory bounded by the
#: payload, a cut push resumed) at no cost in speed.
DEFAULT_BULK_BYTES = 1 << 20
DEFAULT_BULK_BYTES_TLS = 64 << 20
CHUNKS = "chunks"
TOKEN_BYTES = 16
#: Data connections that may be in their handshake at once; more are closed at once.
MAX_HANDSHAKES = 16
#: Bytes read from or written to the data socket per call.
IO_BYTES = 4 << 20
#: Trailing metadata of a refused push whose received part is kept: the bytes kept.
RESUME_KEY = "airgossip-bulk-resume"
#: Refusals after which what arrived is kept for the sender's next offer of the same push.
RESUMABLE = frozenset({"bulk_short", "bulk_broken", "stream_stalled"})
#: Cut pushes kept at once (one per sender; the oldest goes), and how long each.
MAX_PARTIALS = 4
PARTIAL_TTL_S = 60.0
#: Data connections kept open between pushes at once (more are closed after their push),
#: and how long one is kept without a push (longer than a sender keeps it: see
#: :data:`airgossip.edge.transport.bulk_send.IDLE_S`).
MAX_IDLE = 64
IDLE_S = 60.0


class Partials:
    """Cut pushes kept for their sender's next offer of the same header (bounded)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[float, PushAssembler]] = {}

    def keep(self, sender: str, assembler: PushAssembler) -> None:
        now = self._clock()
        with self._lock:
            self._kept.pop(sender, None)
            for stale in [s for s, (until, _) in self._kept.items() if until < now]:
                del self._kept[stale]
            while len(self._kept) >= MAX_PARTIALS:
                del self._kept[next(iter(self._kept))]
            self._kept[sender] = (now + PARTIAL_TTL_S, assembler)

    def take(self, sender: str, header: MessageHeader) -> PushAssembler | None:
        """The cut push of ``sender`` if it had this very header (any other is dropped)."""
        with self._lock:
            until, cut = self._kept.pop(sender, (0.0, None))
        if cut is None or until < self._clock() or cut.header != header:
            return None
        return cut


@dataclass
class Expected:
    """A data connection a push waits for (see :meth:`BulkListener.expect`)."""

    identity: str | None
    token: bytes
    _arrived: threading.Event = field(default_factory=threading.Event)
    _sock: socket.socket | None = None

    def wait(self, timeout_s: float) -> socket.socket | None:
        self._arrived.wait(timeout_s)
        return self._sock

    def wake(self) -> None:
        """End the wait (the push's call ended, or the listener closed)."""
        self._arrived.set()


class BulkListener:
    """Accepts data connections for pushes whose calls wait for them.

    One thread accepts; each connection gets a thread for its handshake and token (at most
    :data:`MAX_HANDSHAKES` at once, each bounded by ``handshake_timeout_s``) and is then
    handed to the push that expects it, whose server thread reads the payload.
    """

    def __init__(
        self,
        host: str,
        security: TlsCredentials | None,
        refused: Callable[[Rejected], None],
        *,
        handshake_timeout_s: float = 10.0,
    ) -> None:
        self._context = ssl_context(security, server=True) if security is not None else None
        self._refused = refused
        self._timeout_s = handshake_timeout_s
        self._lock = threading.Lock()
        self._expected: dict[bytes, Expected] = {}
        self.partials = Partials()
        #: Pushes whose payload arrived whole over a data connection.
        self.received = 0
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._idle: set[socket.socket] = set()
        self._closed = False
        host = host.strip("[]") or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._server = socket.create_server((host, 0), family=family)
        self.port: int = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="bulk-accept", daemon=True)
        self._thread.start()

    def expect(self, identity: str | None) -> Expected:
        """Register a push waiting for its data (``identity``: the call's, with TLS)."""
        expected = Expected(identity, secrets.token_bytes(TOKEN_BYTES))
        with self._lock:
            self._expected[expected.token] = expected
        return expected

    def forget(self, expected: Expected) -> None:
        """The push is over: its token is no longer valid."""
        with self._lock:
            self._expected.pop(expected.token, None)

    def arrived(self, sender: str) -> None:
        """A push's payload arrived whole over its data connection (the first one is
        logged: the bulk path is in use, not only offered)."""
        with self._lock:
            self.received += 1
            first = self.received == 1
        if first:
            log.info("pushes arrive over the bulk path (data port %d), first from %s",
                     self.port, sender[:64])  # fmt: skip

    def keep(self, sock: socket.socket, identity: str | None) -> None:
        """A connection whose push arrived whole: kept open for that sender's next push
        (its next token read by a thread of its own, at most :data:`IDLE_S`), or closed
        when :data:`MAX_IDLE` are kept already."""
        with self._lock:
            kept = not self._closed and len(self._idle) < MAX_IDLE
            if kept:
                self._idle.add(sock)
        if not kept:
            sock.close()
            return
        threading.Thread(target=self._await_token, args=(sock, identity), daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the thread in accept() (Linux)
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._lock:
            self._closed = True
            waiting, self._expected = list(self._expected.values()), {}
            idle, self._idle = list(self._idle), set()
        for expected in waiting:
            expected.wake()
        for sock in idle:  # wakes their threads in recv()
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            if not self._handshakes.acquire(blocking=False):
                conn.close()
                self._refused(
                    Rejected(
                        RejectCode.RESOURCE_EXHAUSTED,
                        "too many data connections in handshake",
                        kind="bulk_busy",
                    )
                )
                continue
            threading.Thread(target=self._greet, args=(conn,), daemon=True).start()

    def _greet(self, conn: socket.socket) -> None:
        try:
            sock, identity, token = self._handshake(conn)
        except (OSError, ValueError) as err:
            conn.close()
            self._refused(
                Rejected(
                    RejectCode.PERMISSION_DENIED,
                    f"data connection refused: {type(err).__name__}: {str(err)[:120]}",
                    kind="bulk_handshake",
                )
            )
            return
        finally:
            self._handshakes.release()
        self._hand_over(sock, identity, token)

    def _await_token(self, sock: socket.socket, identity: str | None) -> None:
        """A kept connection's next push: its token, handed to the push that awaits it."""
        try:
            sock.settimeout(IDLE_S)
            token = _read_token(sock)
        except (OSError, ValueError):  # closed by its sender, idle too long, or bent
            token = None
        with self._lock:
            self._idle.discard(sock)
        if token is None:
            sock.close()
            return
        self._hand_over(sock, identity, token)

    def _hand_over(self, sock: socket.socket, identity: str | None, token: bytes) -> None:
        with self._lock:
            expected = self._expected.pop(token, None)
            if expected is not None and expected.identity not in (None, identity):
                self._expected[token] = expected  # not for this identity: still awaited
                expected = None
        if expected is None:
            sock.close()
            self._refused(
                Rejected(
                    RejectCode.PERMISSION_DENIED,
                    "data connection with a token no push of this identity awaits",
                    kind="bulk_unknown_token",
                )
            )
            return
        expected._sock = sock
        expected.wake()

    def _handshake(self, conn: socket.socket) -> tuple[socket.socket, str | None, bytes]:
        conn.settimeout(self._timeout_s)
        sock, identity = conn, None
        if self._context is not None:
            sock = self._context.wrap_socket(conn, server_side=True)
            identity = ssl_identity(sock)
            if identity is None:
                raise ValueError("the client certificate names no airgossip identity")
        return sock, identity, _read_token(sock)


def _read_token(sock: socket.socket) -> bytes:
    token = _read_exactly(sock, TOKEN_BYTES)
    if len(token) < TOKEN_BYTES:
        raise ValueError("the connection ended before its token")
    return token


def receive_into(
    sock: socket.socket,
    view: memoryview,
    arrived: Callable[[int], None],
    *,
    end: bytes,
    start: int = 0,
    progress_timeout_s: float,
    progress: Callable[[], None],
    time_left: Callable[[], float],
) -> None:
    """Read exactly ``len(view)`` bytes into ``view``, then ``end`` (the push's token
    again: the push is over, the connection may carry the next), calling ``arrived(n)`` as
    bytes land (``start``: where the view begins in the payload).

    Raises :class:`Rejected` for a stream that ends short, carries more than announced (the
    bytes after the payload are not ``end``) or stalls (no bytes for
    ``progress_timeout_s``, or past the push's deadline).
    """
    total, got = start + len(view), start
    try:
        while True:
            left = time_left()
            if left <= 0:
                raise Rejected(
                    RejectCode.DEADLINE_EXCEEDED,
                    "the push ran past its time",
                    kind="stream_deadline",
                )
            sock.settimeout(min(progress_timeout_s, left))
            if got == total:
                if _read_exactly(sock, len(end)) != end:
                    raise Rejected(
                        RejectCode.INVALID_ARGUMENT,
                        f"the data connection carries more than the {total} bytes announced "
                        "(or does not close them with the push's token)",
                        kind="bulk_oversized",
                    )
                return
            n = sock.recv_into(view[got - start : got - start + IO_BYTES])
            if not n:
                raise Rejected(
                    RejectCode.INVALID_ARGUMENT,
                    f"the data connection ended after {got} of the {total} bytes announced",
                    kind="bulk_short",
                )
            got += n
            arrived(n)
            progress()
    except TimeoutError:
        raise Rejected(
            RejectCode.DEADLINE_EXCEEDED,
            f"the data connection stalled after {got} of {total} bytes",
            kind="stream_stalled",
        ) from None
    except (OSError, ssl.SSLError) as err:
        raise Rejected(
            RejectCode.INVALID_ARGUMENT,
            f"the data connection failed after {got} of {total} bytes: {type(err).__name__}",
            kind="bulk_broken",
        ) from None


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes, or fewer where the stream ends first."""
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            break
        data += more
    return data


def receive_offered(
    listener: BulkListener | None,
    context: grpc.ServicerContext,
    assembler: PushAssembler,
    identity: str | None,
    allocate: Callable[[int], bytearray],
    *,
    progress_timeout_s: float,
    progress: Callable[[], None],
    time_left: Callable[[], float],
) -> None:
    """The receiver's side of an offer, once the header passed: the payload over a data
    connection into a buffer from ``allocate`` (or that of a cut push of the same header,
    from where it stopped: no second buffer), or the answer ``chunks`` (no listener) and
    the payload comes over the call as usual."""
    if listener is None:
        assembler.begin(allocate)
        context.send_initial_metadata(((OFFER_KEY, CHUNKS),))
        return
    sender = identity or assembler.header.sender
    cut = listener.partials.take(sender, assembler.header)
    if cut is not None:
        assembler.take_over(cut)
    else:
        assembler.begin(allocate)
    expected = listener.expect(identity)
    context.add_callback(expected.wake)  # a cancelled call stops the wait at once
    start = assembler.received
    try:
        answer = f"{listener.port} {expected.token.hex()} {start}"
        context.send_initial_metadata(((OFFER_KEY, answer),))
        # Half the progress timeout: this refusal, not the watchdog's, says what is missing.
        sock = expected.wait(progress_timeout_s / 2)
        if sock is None:
            raise Rejected(
                RejectCode.DEADLINE_EXCEEDED,
                f"no data connection came for the push within {progress_timeout_s / 2:g} s",
                kind="bulk_no_connection",
            )
        expected._sock = None  # ours now: closed below unless the push arrives whole
        try:

            def fill(view: memoryview, arrived: Callable[[int], None]) -> None:
                receive_into(
                    sock, view, arrived, end=expected.token, start=start,
                    progress_timeout_s=progress_timeout_s, progress=progress,
                    time_left=time_left,
                )  # fmt: skip

            assembler.receive(fill)
        except BaseException:
            sock.close()
            raise
        listener.keep(sock, identity)
        listener.arrived(sender)
    except Rejected as err:
        if err.kind in RESUMABLE and assembler.received > start:
            listener.partials.keep(sender, assembler)  # the next offer resumes from here
            context.set_trailing_metadata(((RESUME_KEY, str(assembler.received)),))
        raise
    finally:
        listener.forget(expected)
        if expected._sock is not None:  # handed over as the wait gave up: never read
            expected._sock.close()
