"""The bulk path: a push's payload over a data connection of its own, its control over gRPC.

A push over gRPC moves its payload through gRPC's own copies and thread hand-offs (five
user-space copies of every byte, see ``docs/performance.md``). On the bulk path the ``Push``
call keeps everything but the payload's bytes: the sender offers the bulk path in the
call's metadata (:data:`OFFER_KEY`) and streams the header alone; the receiver checks it
(identity, ``admit``, sizes) exactly as for any push, takes the payload buffer, and answers
in the call's initial metadata with the port of its data listener and a one-time token.
The sender connects, sends the token and then the payload straight from the flat buffer
(``sendall`` of the tensor's own memory), and ends its request stream; the receiver reads
it in with ``recv_into`` into the buffer already allocated (no other copy, memory bounded
by the payload), checks that exactly the announced bytes came, and only then delivers the
message and acknowledges it on the gRPC call: a refusal is the call's status, as ever, and
a push whose data ended short, ran over or stalled is refused whole, never absorbed.

The data connection is authenticated as the call is: with TLS by mutual TLS on the same
certificates (Python's :mod:`ssl`), its identity that of the call; in plaintext
(``--insecure``) by the token alone (128 random bits, single use, valid while the call
waits). A connection with no valid token, of another identity or that does not finish its
handshake in time is closed and counted as a refusal.
"""

from __future__ import annotations

import secrets
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc

from edge.security.tls import TlsCredentials
from edge.transport.base import GossipMessage, RejectCode, Rejected
from edge.transport.tlssocket import ssl_context, ssl_identity
from edge.transport.wire import PushAssembler, data_frames, frames

#: Metadata key of the offer (the sender's ``offer``) and of the answer (the receiver's
#: ``PORT TOKEN`` hex, or ``chunks``: send the payload over the call as usual).
OFFER_KEY = "airgossip-bulk"
CHUNKS = "chunks"
TOKEN_BYTES = 16
#: Data connections that may be in their handshake at once; more are closed at once.
MAX_HANDSHAKES = 16
#: Bytes read from or written to the data socket per call.
IO_BYTES = 4 << 20


def bulk_refusal(code: RejectCode, reason: str, kind: str) -> Rejected:
    return Rejected(code, reason, kind=kind)


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
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
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

    def close(self) -> None:
        self._server.close()
        with self._lock:
            waiting, self._expected = list(self._expected.values()), {}
        for expected in waiting:
            expected._arrived.set()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            if not self._handshakes.acquire(blocking=False):
                conn.close()
                self._refused(bulk_refusal(
                    RejectCode.RESOURCE_EXHAUSTED, "too many data connections in handshake",
                    "bulk_busy",
                ))  # fmt: skip
                continue
            threading.Thread(target=self._greet, args=(conn,), daemon=True).start()

    def _greet(self, conn: socket.socket) -> None:
        try:
            sock, identity, token = self._handshake(conn)
        except (OSError, ValueError) as err:
            conn.close()
            self._refused(bulk_refusal(
                RejectCode.PERMISSION_DENIED,
                f"data connection refused: {type(err).__name__}: {str(err)[:120]}",
                "bulk_handshake",
            ))  # fmt: skip
            return
        finally:
            self._handshakes.release()
        with self._lock:
            expected = self._expected.pop(token, None)
            if expected is not None and expected.identity not in (None, identity):
                self._expected[token] = expected  # not for this identity: still awaited
                expected = None
        if expected is None:
            sock.close()
            self._refused(bulk_refusal(
                RejectCode.PERMISSION_DENIED,
                "data connection with a token no push of this identity awaits",
                "bulk_unknown_token",
            ))  # fmt: skip
            return
        expected._sock = sock
        expected._arrived.set()

    def _handshake(self, conn: socket.socket) -> tuple[socket.socket, str | None, bytes]:
        conn.settimeout(self._timeout_s)
        sock, identity = conn, None
        if self._context is not None:
            sock = self._context.wrap_socket(conn, server_side=True)
            identity = ssl_identity(sock)
            if identity is None:
                raise ValueError("the client certificate names no airgossip identity")
        token = bytearray(TOKEN_BYTES)
        got = 0
        while got < TOKEN_BYTES:
            n = sock.recv_into(memoryview(token)[got:])
            if not n:
                raise ValueError("the connection ended before its token")
            got += n
        return sock, identity, bytes(token)


def receive_into(
    sock: socket.socket,
    view: memoryview,
    *,
    progress_timeout_s: float,
    progress: Callable[[], None],
    time_left: Callable[[], float],
) -> None:
    """Read exactly ``len(view)`` bytes into ``view``, then the end of the stream.

    Raises :class:`Rejected` for a stream that ends short, carries more than announced or
    stalls (no bytes for ``progress_timeout_s``, or past the push's deadline).
    """
    total, got = len(view), 0
    try:
        while True:
            left = time_left()
            if left <= 0:
                raise bulk_refusal(
                    RejectCode.DEADLINE_EXCEEDED, "the push ran past its time", "stream_deadline"
                )
            sock.settimeout(min(progress_timeout_s, left))
            if got == total:
                extra = sock.recv(1)
                if extra:
                    raise bulk_refusal(
                        RejectCode.INVALID_ARGUMENT,
                        f"the data connection carries more than the {total} bytes announced",
                        "bulk_oversized",
                    )
                return
            n = sock.recv_into(view[got : got + IO_BYTES])
            if not n:
                raise bulk_refusal(
                    RejectCode.INVALID_ARGUMENT,
                    f"the data connection ended after {got} of the {total} bytes announced",
                    "bulk_short",
                )
            got += n
            progress()
    except TimeoutError:
        raise bulk_refusal(
            RejectCode.DEADLINE_EXCEEDED,
            f"the data connection stalled after {got} of {total} bytes",
            "stream_stalled",
        ) from None
    except (OSError, ssl.SSLError) as err:
        raise bulk_refusal(
            RejectCode.INVALID_ARGUMENT,
            f"the data connection failed after {got} of {total} bytes: {type(err).__name__}",
            "bulk_broken",
        ) from None


def receive_offered(
    listener: BulkListener | None,
    context: grpc.ServicerContext,
    assembler: PushAssembler,
    identity: str | None,
    *,
    progress_timeout_s: float,
    progress: Callable[[], None],
    time_left: Callable[[], float],
) -> None:
    """The receiver's side of an offer, once the header passed and the buffer is taken:
    the payload over a data connection into the assembler's buffer, or the answer
    ``chunks`` (no listener) and the payload comes over the call as usual."""
    if listener is None:
        context.send_initial_metadata(((OFFER_KEY, CHUNKS),))
        return
    expected = listener.expect(identity)
    try:
        context.send_initial_metadata(((OFFER_KEY, f"{listener.port} {expected.token.hex()}"),))
        # Half the progress timeout: this refusal, not the watchdog's, says what is missing.
        sock = expected.wait(progress_timeout_s / 2)
        if sock is None:
            raise bulk_refusal(
                RejectCode.DEADLINE_EXCEEDED,
                f"no data connection came for the push within {progress_timeout_s / 2:g} s",
                "bulk_no_connection",
            )
        with sock:
            assembler.receive(
                lambda view: receive_into(
                    sock, view, progress_timeout_s=progress_timeout_s, progress=progress,
                    time_left=time_left,
                )
            )  # fmt: skip
    finally:
        listener.forget(expected)


def parse_answer(answer: str) -> tuple[int, bytes] | None:
    """The port and token of a receiver's answer; None for ``chunks``; ValueError if bent."""
    if answer == CHUNKS:
        return None
    port_text, _, token_hex = answer.partition(" ")
    port, token = int(port_text), bytes.fromhex(token_hex)
    if not 0 < port < 65536 or len(token) != TOKEN_BYTES:
        raise ValueError(f"a bulk answer must be PORT TOKEN, not {answer[:80]!r}")
    return port, token


def send_payload(
    host: str,
    port: int,
    token: bytes,
    data: memoryview,
    *,
    peer: str,
    context: ssl.SSLContext | None,
    timeout_s: float,
) -> None:
    """Connect to a receiver's data listener and send the token, then ``data`` from its own
    memory. With TLS the receiver's certificate must name ``peer``."""
    sock = socket.create_connection((host.strip("[]"), port), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None:
            sock = context.wrap_socket(sock)
            named = ssl_identity(sock)
            if named != peer:
                raise ConnectionError(f"the data listener names {named!r}, not {peer!r}")
        sock.sendall(token)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # the end of the payload: the receiver checks it
        # Until the receiver closes: closing first with bytes unread (a TLS 1.3 session
        # ticket, say) would reset the connection and drop what it has not read yet.
        while sock.recv(1 << 12):
            pass
    finally:
        sock.close()


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

    def requests(self) -> Iterator[bytes]:
        yield next(frames(GossipMessage(self._message.header, b"")))
        if self._answered.wait(self._timeout_s) and self._over_chunks:
            yield from data_frames(memoryview(self._message.data).cast("B"), self._chunk_bytes)

    def complete(
        self, call: grpc.Future, host: str, peer: str, context: ssl.SSLContext | None
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
            data = memoryview(self._message.data).cast("B")
            send_payload(host, *target, data, peer=peer, context=context, timeout_s=self._timeout_s)
        except (OSError, ValueError, ssl.SSLError) as err:
            call.cancel()
            raise Rejected(
                RejectCode.UNAVAILABLE,
                f"data connection to {peer} failed: {type(err).__name__}: {str(err)[:160]}",
                kind="bulk_failed",
            ) from None
        finally:
            self._answered.set()
