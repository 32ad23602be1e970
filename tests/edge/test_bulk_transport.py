"""The bulk path's data connections: mutual TLS on plain sockets, real sockets on loopback."""

from __future__ import annotations

import contextlib
import random
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import numpy as np
import pytest

from airgossip.common.security.tls import dial
from airgossip.edge.algorithms.base import Ack
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.transport import bulk_send
from airgossip.edge.transport.base import (
    GossipMessage,
    LinkVerdict,
    MessageHeader,
    Rejected,
    SendOutcome,
)
from airgossip.edge.transport.bulk import (
    DEFAULT_BULK_BYTES,
    DEFAULT_BULK_BYTES_TLS,
    OFFER_KEY,
    RESUME_KEY,
)
from airgossip.edge.transport.bulk_send import parse_answer
from airgossip.edge.transport.grpc_transport import GrpcTransport
from airgossip.edge.transport.tlssocket import ssl_context, ssl_identity
from airgossip.edge.transport.wire import CHUNK_BYTES, frames
from airgossip.protos import gossip_pb2
from tests.support.agents import TlsFleet, assert_pair_reaches_average, grpc_pair
from tests.support.tls import credentials

ROUNDS_AT_LOSS = 200
# The session's CA is made on first use (not thread-safe): before any thread asks for it.
SERVER = credentials("agent-1")


def _serve_once(server: socket.socket, out: list[object]) -> None:
    conn, _ = server.accept()
    try:
        tls = ssl_context(SERVER, server=True).wrap_socket(conn, server_side=True)
        out.append(ssl_identity(tls))
        tls.sendall(b"k")
        tls.close()
    except (OSError, ssl.SSLError) as err:
        out.append(err)
        conn.close()


def test_mutual_tls_sockets_name_each_other_by_their_certificates() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        seen: list[object] = []
        thread = threading.Thread(target=_serve_once, args=(server, seen))
        thread.start()
        raw = socket.create_connection(server.getsockname())
        with ssl_context(credentials("agent-0"), server=False).wrap_socket(raw) as client:
            assert ssl_identity(client) == "agent-1"
            assert client.recv(1) == b"k"
        thread.join(10)
    assert seen == ["agent-0"]


def test_a_client_without_a_certificate_is_refused_in_the_handshake() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        seen: list[object] = []
        thread = threading.Thread(target=_serve_once, args=(server, seen))
        thread.start()
        bare = ssl.create_default_context()
        bare.check_hostname, bare.verify_mode = False, ssl.CERT_NONE
        raw = socket.create_connection(server.getsockname())
        with pytest.raises((ssl.SSLError, OSError)), bare.wrap_socket(raw) as client:
            client.recv(1)
        thread.join(10)
    assert len(seen) == 1 and isinstance(seen[0], ssl.SSLError)


# -- the bulk path between two transports --------------------------------------------------
class Taker:
    """An inbound handler that keeps what it was given and what was refused."""

    def __init__(self) -> None:
        self.delivered: list[bytes] = []
        self.refusals: list[Rejected] = []

    def accepts(self, sender: str) -> None:
        pass

    def admit(self, header: MessageHeader) -> None:
        pass

    def deliver(self, message: GossipMessage) -> Ack:
        self.delivered.append(bytes(message.data))
        return Ack(message.header.seq, message.header.seq, True, message.header.round)

    def refused(self, error: Rejected) -> None:
        self.refusals.append(error)


def header_of(size: int, sender: str = "agent-0") -> MessageHeader:
    return MessageHeader(
        sender=sender, round=1, seq=1, base_seq=0, algorithm="push-sum", codec="raw:uint8",
        numel=size, payload_bytes=size,
    )  # fmt: skip


@contextmanager
def receiver(
    secure: bool, bulk_bytes: int | None = 1, **options: float
) -> Iterator[tuple[GrpcTransport, Taker, str]]:
    taker = Taker()
    security = SERVER if secure else None
    transport = GrpcTransport("agent-1", security=security, bulk_bytes=bulk_bytes, **options)
    address = transport.start(taker)
    try:
        yield transport, taker, address
    finally:
        transport.close()


def send(transport: GrpcTransport, address: str, message: GossipMessage) -> SendOutcome:
    done = threading.Event()
    outcome: list[SendOutcome] = []
    transport.send("agent-1", address, message, lambda o: (outcome.append(o), done.set()))
    assert done.wait(30)
    return outcome[0]


@pytest.mark.parametrize("secure", [True, False])
def test_by_default_large_pushes_take_the_bulk_path_and_small_ones_the_call(secure: bool) -> None:
    """With no setting at either end: a push of the default size or more (1 MiB in plaintext,
    64 MiB over mutual TLS) goes over a data connection, a smaller one over the call, both bit
    for bit."""
    default = DEFAULT_BULK_BYTES_TLS if secure else DEFAULT_BULK_BYTES
    sizes = [default, default - 1, 64 << 10]
    payloads = [np.random.default_rng(n).integers(0, 256, n, np.uint8) for n in sizes]
    sender = GrpcTransport("agent-0", security=credentials("agent-0") if secure else None)
    with receiver(secure, None) as (transport, taker, address):
        try:
            on_bulk = []
            for payload in payloads:
                message = GossipMessage(header_of(payload.size), memoryview(payload))
                outcome = send(sender, address, message)
                assert outcome.delivered, outcome.error
                assert transport._bulk is not None
                on_bulk.append(transport._bulk.received)
        finally:
            sender.close()
    assert sender.bulk_bytes == transport.bulk_bytes == default
    assert on_bulk == [1, 1, 1]  # the first push only came over a data connection
    assert taker.delivered == [p.tobytes() for p in payloads]


@pytest.mark.parametrize("secure", [True, False])
@pytest.mark.parametrize("receiver_bulk", [1, 0])
def test_a_push_over_the_bulk_path_arrives_bit_for_bit(
    secure: bool, receiver_bulk: int | None
) -> None:
    """Several chunks' worth and an odd size; a receiver without the bulk path answers
    ``chunks`` and the same push comes over the call."""
    payload = np.random.default_rng(1).integers(0, 256, 3 * CHUNK_BYTES + 5, np.uint8)
    sender = GrpcTransport("agent-0", security=credentials("agent-0") if secure else None,
                           bulk_bytes=1024)  # fmt: skip
    with receiver(secure, receiver_bulk) as (_, taker, address):
        try:
            for _ in range(2):
                message = GossipMessage(header_of(payload.size), memoryview(payload))
                outcome = send(sender, address, message)
                assert outcome.delivered and outcome.ack is not None, outcome.error
        finally:
            sender.close()
    assert taker.delivered == [payload.tobytes()] * 2
    assert taker.refusals == []


@pytest.mark.parametrize("secure", [True, False])
def test_consensus_over_the_bulk_path_is_exact(secure: bool) -> None:
    settings = AgentSettings(
        task=TaskSettings(name="consensus", dim=8), rounds=30, wait_timeout_s=0.5, seed=5
    )
    for pair in grpc_pair(settings, secure=secure, bulk_bytes=1):
        assert_pair_reaches_average(pair, timeout_s=60)
        assert all(a.transport.bulk_bytes == 1 for a in pair)  # type: ignore[attr-defined]


def offered_push(
    address: str, size: int, identity: str | None, act: Callable[[str, int, bytes], None]
) -> grpc.RpcError:
    """A push offering the bulk path, whose data connection ``act(host, port, token)``
    makes; the call's error (it must fail)."""
    security = credentials(identity) if identity else None
    with dial(address, "agent-1", security) as channel:
        push = channel.stream_unary(
            "/airgossip.v1.Gossip/Push", request_serializer=None,
            response_deserializer=gossip_pb2.PushAck.FromString,
        )  # fmt: skip
        finished = threading.Event()

        def requests() -> Iterator[bytes]:
            yield next(frames(GossipMessage(header_of(size, identity or "agent-0"), b"")))
            finished.wait(20)

        call = push.future(requests(), timeout=20, metadata=((OFFER_KEY, "offer"),))
        try:
            answer = parse_answer(dict(call.initial_metadata())[OFFER_KEY])
            assert answer is not None
            port, token, start = answer
            assert start == 0
            act(address.rpartition(":")[0], port, token)
        finally:
            finished.set()
        with pytest.raises(grpc.RpcError) as info:
            call.result()
    return info.value


def data_connection(host: str, port: int, identity: str | None) -> socket.socket:
    sock = socket.create_connection((host, port))
    if identity is None:
        return sock
    return ssl_context(credentials(identity), server=False).wrap_socket(sock)


INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("secure", [True, False])
@pytest.mark.parametrize(
    ("extra", "code", "reason", "kind"),
    [
        (-1000, INVALID, "ended after 9000 of the 10000 bytes", "bulk_short"),
        (7, INVALID, "carries more than the 10000 bytes", "bulk_oversized"),
    ],
)  # fmt: skip
def test_a_short_or_oversized_data_stream_is_refused_and_not_absorbed(
    secure: bool, extra: int, code: grpc.StatusCode, reason: str, kind: str
) -> None:
    identity = "agent-0" if secure else None

    def act(host: str, port: int, token: bytes) -> None:
        with data_connection(host, port, identity) as sock:
            sock.sendall(token + bytes(10_000 + extra))
            sock.shutdown(socket.SHUT_WR)
            with contextlib.suppress(ConnectionResetError):  # closed with bytes unread
                while sock.recv(4096):
                    pass

    with receiver(secure) as (_, taker, address):
        error = offered_push(address, 10_000, identity, act)
    assert error.code() == code and reason in str(error.details())
    assert [r.kind for r in taker.refusals] == [kind]
    # A short stream is kept for the sender to resume, and the sender is told so.
    kept = dict(error.trailing_metadata() or ()).get(RESUME_KEY)
    assert kept == ("9000" if kind == "bulk_short" else None)
    assert taker.delivered == []


def test_an_unauthenticated_or_foreign_data_connection_is_refused() -> None:
    """A connection without a certificate fails its handshake, one of another identity or
    with a token no push awaits is closed; the push they hoped to join is never absorbed
    (no data connection of its own came: refused once its wait is over)."""

    def act(host: str, port: int, token: bytes) -> None:
        bare = ssl.create_default_context()
        bare.check_hostname, bare.verify_mode = False, ssl.CERT_NONE
        raw = socket.create_connection((host, port))
        with pytest.raises((ssl.SSLError, OSError)), bare.wrap_socket(raw) as sock:
            sock.sendall(token)
            sock.recv(1)
        for identity, sent in (("mallory", token), ("agent-0", bytes(len(token)))):
            with data_connection(host, port, identity) as sock:
                sock.sendall(sent + bytes(100))
                assert sock.recv(1) == b""  # closed by the receiver

    with receiver(True, progress_timeout_s=2.0) as (_, taker, address):
        error = offered_push(address, 100, "agent-0", act)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "no data connection came" in str(error.details())
    kinds = sorted(r.kind for r in taker.refusals)
    assert kinds == [
        "bulk_handshake",
        "bulk_no_connection",
        "bulk_unknown_token",
        "bulk_unknown_token",
    ]
    assert taker.delivered == []


class Lossy:
    """Drops each message with probability ``loss`` (seeded; a lock: senders are threads)."""

    def __init__(self, loss: float, seed: int) -> None:
        self.loss, self.rng, self.lock = loss, random.Random(seed), threading.Lock()
        self.dropped = 0

    def plan(self, sender: str, receiver: str, round: int, index: int, nbytes: int) -> LinkVerdict:
        with self.lock:
            drop = self.rng.random() < self.loss
            self.dropped += drop
        return LinkVerdict(drop=drop)


@pytest.mark.slow  # about 50 s on 2 shared cores
def test_sixteen_agents_at_30_percent_loss_reach_the_exact_average_over_the_bulk_path() -> None:
    """Real gRPC with mutual TLS, every push's payload over its data connection."""
    shaper = Lossy(0.3, seed=11)
    fleet = TlsFleet(16, rounds=ROUNDS_AT_LOSS, bulk_bytes=1, shaper=shaper)
    try:
        fleet.run_to_end(timeout_s=300)
        assert fleet.relative_error() < 1e-6
        assert shaper.dropped > 0
        assert all(a.counters().messages_rejected == 0 for a in fleet.agents)
    finally:
        fleet.close()


@pytest.mark.parametrize("secure", [True, False])
def test_a_push_cut_at_half_resumes_where_it_stopped_and_arrives_bit_for_bit(
    secure: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first data connection is cut after half the payload (the sender's socket closed
    abruptly); the receiver refuses that call, keeps what arrived, and answers the next
    offer of the same push with where to go on: only the second half is sent again."""
    payload = np.random.default_rng(2).integers(0, 256, 8 * CHUNK_BYTES + 3, np.uint8)
    sent: list[int] = []
    real = bulk_send.send_payload

    def cut_once(host: str, port: int, token: bytes, data: memoryview, **kw: object) -> None:
        sent.append(len(data))
        if len(sent) > 1:
            return real(host, port, token, data, **kw)  # type: ignore[arg-type]
        sock = socket.create_connection((host, port))
        context = kw["context"]
        if isinstance(context, ssl.SSLContext):
            sock = context.wrap_socket(sock)
        sock.sendall(token)
        sock.sendall(data[: len(data) // 2])
        # The cut lands after exactly half: the write side ends, and the socket closes only
        # once the receiver has read up to it and closed its end. Closing at once would reset
        # the connection where TLS left bytes unread (the server's session tickets), and a
        # reset throws away what is still queued: a cut at a point nobody chose.
        sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            while sock.recv(1 << 16):
                pass
        sock.close()
        raise ConnectionResetError("the link went down")

    monkeypatch.setattr(bulk_send, "send_payload", cut_once)
    sender = GrpcTransport("agent-0", security=credentials("agent-0") if secure else None,
                           bulk_bytes=1024)  # fmt: skip
    with receiver(secure) as (_, taker, address):
        try:
            outcome = send(sender, address, GossipMessage(header_of(payload.size), payload))
        finally:
            sender.close()
    assert outcome.delivered, outcome.error
    assert sent == [payload.size, payload.size - payload.size // 2]
    assert taker.delivered == [payload.tobytes()]
    assert [r.kind for r in taker.refusals] == ["bulk_short"]


def test_closing_the_transport_closes_its_data_listener() -> None:
    with receiver(False) as (transport, _, _):
        listener = transport._bulk
        assert listener is not None
        port = listener.port
        socket.create_connection(("127.0.0.1", port)).close()  # listening
    listener._thread.join(5)
    assert not listener._thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port)).close()


@pytest.mark.parametrize("secure", [True, False])
def test_a_data_port_that_cannot_be_reached_sends_the_push_over_the_call(secure: bool) -> None:
    """As behind a service that forwards the gossip port alone: the offer is given up, the
    push goes over the call, and so do that peer's next pushes (no second offer)."""
    payload = np.random.default_rng(3).integers(0, 256, 2 * CHUNK_BYTES + 1, np.uint8)
    with socket.create_server(("127.0.0.1", 0)) as probe:
        closed_port = probe.getsockname()[1]  # nothing listens there once closed
    sender = GrpcTransport("agent-0", security=credentials("agent-0") if secure else None,
                           bulk_bytes=1024)  # fmt: skip
    with receiver(secure) as (transport, taker, address):
        assert transport._bulk is not None
        transport._bulk.port = closed_port
        try:
            for _ in range(2):
                outcome = send(sender, address, GossipMessage(header_of(payload.size), payload))
                assert outcome.delivered, outcome.error
        finally:
            sender.close()
    assert taker.delivered == [payload.tobytes()] * 2
    kinds = [r.kind for r in taker.refusals]
    assert kinds.count("bulk_no_connection") == 1  # the one offer, given up
    assert set(kinds) <= {"bulk_no_connection", "busy_edge"}
    assert not sender.data_ports.reachable(address, "agent-1")


@pytest.mark.parametrize("secure", [True, False])
def test_pushes_to_one_receiver_share_one_data_connection_and_open_another_when_it_closed(
    secure: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data connection stays open after an acknowledged push, and the next push to the
    same receiver goes over it (one TLS handshake, not one a push); once the receiver has
    closed it (as after its idle time), the next push notices and opens a new one."""
    payload = np.random.default_rng(4).integers(0, 256, 2 * CHUNK_BYTES + 7, np.uint8)
    opened: list[int] = []
    real = bulk_send._connect

    def counted(host: str, port: int, **kw: object) -> socket.socket:
        opened.append(port)
        return real(host, port, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(bulk_send, "_connect", counted)
    sender = GrpcTransport("agent-0", security=credentials("agent-0") if secure else None,
                           bulk_bytes=1024)  # fmt: skip
    with receiver(secure) as (transport, taker, address):
        listener = transport._bulk
        assert listener is not None
        try:
            for _ in range(3):
                outcome = send(sender, address, GossipMessage(header_of(payload.size), payload))
                assert outcome.delivered, outcome.error
            assert len(opened) == 1 and len(listener._idle) == 1
            for kept in list(listener._idle):  # the receiver lets it go
                kept.shutdown(socket.SHUT_RDWR)
            for _ in range(60):
                if not listener._idle:
                    break
                threading.Event().wait(0.05)
            outcome = send(sender, address, GossipMessage(header_of(payload.size), payload))
            assert outcome.delivered, outcome.error
        finally:
            sender.close()
    assert len(opened) == 2
    assert taker.delivered == [payload.tobytes()] * 4
    assert taker.refusals == []
    assert listener.received == 4
