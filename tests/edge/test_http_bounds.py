"""The metrics HTTP server under idle, half-open and slow clients, over real sockets: scrapes
answered within a second while 200 connections sit idle (plain and TLS), a bounded number of
threads whatever the connections, idle ones dropped at their deadline or when newer ones
need the room; TLS and basic auth in front of every route."""

from __future__ import annotations

import base64
import contextlib
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

import airgossip.common.http
from airgossip.common.http import (
    ROUTE_WORKERS,
    BasicAuth,
    HttpSecurity,
    MetricsServer,
    http_security,
)
from airgossip.common.security.tls import METRICS_NAME, SecurityError
from tests.support.tls import credentials, credentials_folder

IDLE = 200


def registry() -> CollectorRegistry:
    r = CollectorRegistry()
    Counter("airgossip_test_scrapes", "A series to find.", registry=r).inc()
    return r


@contextlib.contextmanager
def serving(security: HttpSecurity | None = None) -> Iterator[MetricsServer]:
    server = MetricsServer(registry(), "127.0.0.1:0", security=security)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def connect(server: MetricsServer, count: int) -> list[socket.socket]:
    host, port = server.address.rsplit(":", 1)
    return [socket.create_connection((host, int(port)), timeout=5) for _ in range(count)]


def scrape(url: str, auth: str | None = None) -> bytes:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    with urllib.request.urlopen(request, timeout=5) as reply:
        body: bytes = reply.read()
        return body


def client_context() -> ssl.SSLContext:
    """A scraper's TLS: the fleet's CA, the name checked against ``server_hostname``."""
    return ssl.create_default_context(cadata=credentials("agent-0").ca_pem.decode())


def timed_scrapes(url: str) -> list[float]:
    took = []
    for _ in range(5):
        started = time.monotonic()
        assert b"airgossip_test_scrapes_total 1.0" in scrape(url)
        took.append(time.monotonic() - started)
    return took


def test_scrapes_are_answered_within_a_second_while_200_connections_idle() -> None:
    with serving() as server:
        before = threading.active_count()
        idle = connect(server, IDLE)
        for sock in idle[:20]:  # half a request, never finished (slowloris)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        try:
            took = timed_scrapes(f"http://{server.address}/metrics")
            assert max(took) < 1.0, took
            # A socket per connection, not a thread: the loop and the route workers only.
            assert threading.active_count() - before <= 1 + ROUTE_WORKERS
        finally:
            for sock in idle:
                sock.close()


def test_over_tls_idle_connections_that_never_shake_hands_block_nothing() -> None:
    security = HttpSecurity(tls=credentials("agent-3"))
    with serving(security) as server:
        idle = connect(server, IDLE)
        try:
            port = server.port
            # The scraper verifies the fleet's CA and the fleet-wide metrics name (what
            # Prometheus's tls_config sets as server_name); the address itself is not named.
            context = client_context()
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                context.wrap_socket(raw, server_hostname=METRICS_NAME) as tls,
            ):
                tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = b""
                while chunk := tls.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 200") and b"airgossip_test_scrapes" in answer
            started = time.monotonic()
            for _ in range(5):
                with (
                    socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                    context.wrap_socket(raw, server_hostname="agent-3") as tls,
                ):
                    tls.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    assert tls.recv(12) == b"HTTP/1.1 200"
            assert (time.monotonic() - started) / 5 < 1.0
            with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP
                scrape(f"http://{server.address}/metrics")
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                pytest.raises(ssl.SSLCertVerificationError),
            ):
                context.wrap_socket(raw, server_hostname="agent-4")  # not who it is
        finally:
            for sock in idle:
                sock.close()


def closed(sock: socket.socket, wait_s: float) -> bool:
    """Whether the server closed ``sock`` (it sent nothing; reading tells)."""
    sock.settimeout(wait_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_connections_are_dropped_at_their_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(airgossip.common.http, "HEADER_TIMEOUT_S", 0.5)
    with serving() as server:
        idle = connect(server, 30)
        try:
            assert all(closed(sock, 5.0) for sock in idle)
        finally:
            for sock in idle:
                sock.close()


def test_newer_connections_take_the_room_of_the_oldest_idle_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(airgossip.common.http, "MAX_CONNECTIONS", 8)
    with serving() as server:
        idle = connect(server, 30)
        try:
            assert b"airgossip_test_scrapes" in scrape(f"http://{server.address}/metrics")
            # Long before their deadline, the oldest made room: 8 at most are held.
            still = [sock for sock in idle if not closed(sock, 0.05)]
            assert len(still) <= 8 and all(sock in idle[-8:] for sock in still)
        finally:
            for sock in idle:
                sock.close()


def test_basic_auth_guards_every_route() -> None:
    security = HttpSecurity(basic_auth=BasicAuth("prometheus", "s3cret pass"))
    with serving(security) as server:
        url = f"http://{server.address}/metrics"
        for auth in (None, "prometheus:wrong", "someone:s3cret pass", "prometheus"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                scrape(url, auth=auth)
            assert refused.value.code == 401
            assert refused.value.headers["WWW-Authenticate"] == 'Basic realm="airgossip"'
        assert b"airgossip_test_scrapes" in scrape(url, auth="prometheus:s3cret pass")
        with pytest.raises(urllib.error.HTTPError) as missing:
            scrape(f"http://{server.address}/nope", auth="prometheus:s3cret pass")
        assert missing.value.code == 404


def test_garbage_requests_get_a_status_and_the_server_stays_up() -> None:
    with serving() as server:
        for request in (b"\x16\x03\x01garbage\r\n\r\n", b"POST /metrics HTTP/1.1\r\n\r\n",
                        b"GET /metrics\r\n\r\n", b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
                        b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"):  # fmt: skip
            (sock,) = connect(server, 1)
            with sock:
                sock.sendall(request)
                answer = sock.recv(64)
            assert answer == b"" or answer.split(b" ")[1] in (b"400", b"405"), answer
        assert b"airgossip_test_scrapes" in scrape(f"http://{server.address}/metrics")


def test_options_that_do_not_go_together_are_one_line(tmp_path: Path) -> None:
    folder = credentials_folder()
    with pytest.raises(ValueError, match="give --certs too"):
        http_security(None, "agent-0", tls=True)
    with pytest.raises(ValueError, match="go together"):
        http_security(folder, "agent-0", user="prometheus")
    with pytest.raises(ValueError, match="cannot read the metrics password file"):
        http_security(folder, "agent-0", user="p", password_file=tmp_path / "missing")
    (tmp_path / "empty").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        http_security(folder, "agent-0", user="p", password_file=tmp_path / "empty")
    with pytest.raises(ValueError, match="hold no ':'"):
        BasicAuth("a:b", "x")
    with pytest.raises(SecurityError):
        http_security(tmp_path, "agent-0", tls=True)
    (tmp_path / "password").write_text("s3cret\n")
    security = http_security(
        folder, "agent-0", tls=True, user="p", password_file=tmp_path / "password"
    )
    assert security.scheme == "https" and security.basic_auth == BasicAuth("p", "s3cret")
