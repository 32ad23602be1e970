"""The small HTTP server of an agent's or the coordinator's metrics: ``/metrics`` and a few
JSON routes, optionally behind TLS and basic auth.

It runs an asyncio loop in one background thread, so an idle or half-open connection costs a
socket, not a thread: 200 connections that never send a request leave scrapes answered at
once. Each connection gets :data:`HEADER_TIMEOUT_S` to send its request's head (after
:data:`TLS_HANDSHAKE_TIMEOUT_S` for the handshake, with TLS), one request, one answer, then
it is closed. At most :data:`MAX_CONNECTIONS` are held past the handshake; a new one beyond
that closes the oldest that is still waiting for its request, so a scraper (which sends its
request at once) always gets in. Routes are computed on a small thread pool, so a slow one
never stalls the loop.

:class:`HttpSecurity` puts TLS (the process's own certificate, :mod:`airgossip.common.security.tls`)
and HTTP basic auth in front of every route; Prometheus scrapes such an endpoint with its
``tls_config`` (the fleet's CA, ``server_name`` :data:`~airgossip.common.security.tls.METRICS_NAME`
or the process's identity) and ``basic_auth``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import errno
import hmac
import ipaddress
import json
import logging
import os
import socket
import ssl
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from airgossip.common.ports import split_listen
from airgossip.common.security.tls import TlsCredentials

log = logging.getLogger("airgossip.http")

#: A route answers with (status, content type, body); it gets the request's Accept header.
Route = Callable[[str], tuple[int, str, bytes]]

#: Connections held at once past the TLS handshake; beyond, the oldest one still waiting
#: for its request is closed.
MAX_CONNECTIONS = 512
#: Longest a connection may take to send its request's head (request line and headers).
HEADER_TIMEOUT_S = 5.0
#: Longest a TLS handshake may take.
TLS_HANDSHAKE_TIMEOUT_S = 5.0
#: Longest the answer may take to leave (a client that does not read it is dropped).
WRITE_TIMEOUT_S = 10.0
#: Largest request head read; a longer one is refused.
MAX_HEADER_BYTES = 16 * 1024
#: Threads computing routes (a scrape of /metrics takes milliseconds).
ROUTE_WORKERS = 2


@dataclass(frozen=True)
class BasicAuth:
    """HTTP basic auth: the one user name and password every request must carry."""

    username: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.username or ":" in self.username:
            raise ValueError("the metrics user name must be non-empty and hold no ':'")
        if not self.password:
            raise ValueError("the metrics password must not be empty")

    @classmethod
    def from_file(cls, username: str, path: Path) -> BasicAuth:
        """The user ``username`` with the password in ``path`` (its first line), as
        Prometheus's ``basic_auth.password_file`` reads it; ``ValueError`` in one line."""
        try:
            text = path.read_text()
        except OSError as err:
            raise ValueError(
                f"cannot read the metrics password file {path}: {err.strerror}"
            ) from None
        password = text.splitlines()[0] if text else ""
        if not password:
            raise ValueError(f"the metrics password file {path} is empty")
        return cls(username, password)

    def accepts(self, authorization: str) -> bool:
        """Whether an ``Authorization`` header carries this user and password."""
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, _, password = decoded.partition(b":")
        # Both compared, always: the time taken says nothing about which one differs.
        same_user = hmac.compare_digest(user, self.username.encode())
        same_password = hmac.compare_digest(password, self.password.encode())
        return same_user and same_password


@dataclass(frozen=True)
class HttpSecurity:
    """What guards an HTTP endpoint: TLS with the process's certificate, basic auth, both
    or neither (plain HTTP, for loopback and demos)."""

    tls: TlsCredentials | None = None
    basic_auth: BasicAuth | None = None

    @property
    def scheme(self) -> str:
        """``https`` or ``http``."""
        return "https" if self.tls is not None else "http"


def http_security(
    certs: Path | None,
    identity: str,
    *,
    tls: bool = False,
    user: str | None = None,
    password_file: Path | None = None,
) -> HttpSecurity:
    """What guards a process's metrics endpoint, from its command-line options: TLS with the
    certificate of ``identity`` in ``certs``, basic auth for ``user`` with the password in
    ``password_file``.

    Raises
    ------
    ValueError
        Options that do not go together, or credentials that cannot be read (one line).
    """
    if tls and certs is None:
        raise ValueError("--metrics-tls serves the process's own certificate: give --certs too")
    if (user is None) != (password_file is None):
        raise ValueError("--metrics-user and --metrics-password-file go together")
    credentials = TlsCredentials.load(certs, identity) if tls and certs is not None else None
    auth = (
        BasicAuth.from_file(user, password_file)
        if user is not None and password_file is not None
        else None
    )
    return HttpSecurity(credentials, auth)


def server_context(credentials: TlsCredentials) -> ssl.SSLContext:
    """A TLS server context presenting ``credentials``' certificate (TLS 1.2 or newer)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # ssl reads certificates from files only: a private folder, gone once they are read.
    with tempfile.TemporaryDirectory(prefix="airgossip-tls-") as folder:
        paths = []
        for name, data in (("cert.pem", credentials.cert_pem), ("key.pem", credentials.key_pem)):
            path = os.path.join(folder, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            paths.append(path)
        context.load_cert_chain(paths[0], paths[1])
    return context


def exposition_route(registry: CollectorRegistry) -> Route:
    """A route serving ``registry`` in the format the scraper asks for."""

    def serve(accept: str) -> tuple[int, str, bytes]:
        encoder, content_type = choose_encoder(accept)
        return 200, content_type, encoder(registry)

    return serve


def json_route(produce: Callable[[], object]) -> Route:
    """A route serving whatever ``produce`` returns as JSON."""

    def serve(accept: str) -> tuple[int, str, bytes]:
        return 200, "application/json", json.dumps(produce()).encode()

    return serve


def _listening_socket(listen: str) -> socket.socket:
    host, port = split_listen(listen, "serve metrics")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # A restarted process must get its port back while old connections sit in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host or "0.0.0.0", port))
        sock.listen(MAX_CONNECTIONS)
        sock.setblocking(False)
    except OSError as err:
        sock.close()
        reason = "the port is in use" if err.errno == errno.EADDRINUSE else err.strerror
        raise OSError(f"cannot serve metrics on {listen}: {reason}") from None
    return sock


def _head(status: int, content_type: str, length: int, extra: str = "") -> bytes:
    phrase = HTTPStatus(status).phrase
    return (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\n{extra}Connection: close\r\n\r\n"
    ).encode("latin-1")


class MetricsServer:
    """``/metrics`` plus any extra routes, on one port, from one background thread.

    Parameters
    ----------
    registry:
        Served at ``/metrics``.
    listen:
        ``host:port``; port 0 picks a free port (see :attr:`address`).
    routes:
        More ``{path: route}`` (the coordinator adds service discovery).
    security:
        TLS and basic auth in front of every route (None: plain HTTP).

    Raises
    ------
    OSError
        With a one-line reason when ``listen`` cannot be bound.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        listen: str = "127.0.0.1:0",
        *,
        routes: dict[str, Route] | None = None,
        security: HttpSecurity | None = None,
    ) -> None:
        self.routes: dict[str, Route] = {"/metrics": exposition_route(registry), **(routes or {})}
        self.security = security or HttpSecurity()
        self._tls = server_context(self.security.tls) if self.security.tls else None
        self._sock = _listening_socket(listen)
        host = listen.rpartition(":")[0].strip("[]")
        bound = self._sock.getsockname()[1]
        shown = host if host and host not in ("0.0.0.0", "::") else "127.0.0.1"
        self.address = f"[{shown}]:{bound}" if ":" in shown else f"{shown}:{bound}"
        self.port = int(bound)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)
        #: Connections still waiting for their request, oldest first (the loop's own).
        self._waiting: OrderedDict[int, asyncio.StreamWriter] = OrderedDict()
        self._open: set[asyncio.StreamWriter] = set()
        self._pool = ThreadPoolExecutor(ROUTE_WORKERS, thread_name_prefix="metrics-route")

    @property
    def url(self) -> str:
        """Where a scraper on this host finds ``/metrics``."""
        return f"{self.security.scheme}://{self.address}/metrics"

    def start(self) -> str:
        """Serve in a background thread; return ``host:port`` as a scraper on this host sees it."""
        host = self._sock.getsockname()[0]
        if self.security.tls is None and not ipaddress.ip_address(host).is_loopback:
            log.warning(
                "metrics on %s are plain HTTP%s: TLS (--metrics-tls) keeps them private "
                "beyond loopback", self.address,
                " with basic auth" if self.security.basic_auth else ", open to anyone",
            )  # fmt: skip
        self._thread.start()
        self._ready.wait(timeout=10.0)
        return self.address

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(self._loop_error)
        self._loop = loop
        try:
            serving = asyncio.start_server(
                self._serve,
                sock=self._sock,
                ssl=self._tls,
                limit=MAX_HEADER_BYTES,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if self._tls else None,
            )
            self._server = loop.run_until_complete(serving)
            self._ready.set()
            loop.run_forever()
        finally:
            self._ready.set()
            loop.run_until_complete(self._close())
            loop.close()

    async def _close(self) -> None:
        for writer in list(self._open):
            writer.transport.abort()
        if self._server is not None:
            self._server.close()
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    @staticmethod
    def _loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        error = context.get("exception")
        if isinstance(error, (ssl.SSLError, ConnectionError, TimeoutError)):
            return  # a client that failed its handshake or went away: nothing to say
        more = f": {error}" if error else ""
        log.warning("metrics HTTP server: %s%s", context.get("message"), more)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        key = id(writer)
        self._open.add(writer)
        if len(self._open) > MAX_CONNECTIONS and self._waiting:
            _, oldest = self._waiting.popitem(last=False)
            oldest.transport.abort()
        self._waiting[key] = writer
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEADER_TIMEOUT_S)
            finally:
                self._waiting.pop(key, None)
            answer = await self._answer(head)
            writer.write(answer)
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
            writer.close()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError):
            writer.transport.abort()
        except (ConnectionError, OSError, ssl.SSLError):
            writer.transport.abort()
        finally:
            self._open.discard(writer)

    async def _answer(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return self._plain(400, "bad request line\n")
        method, target, _ = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if line and not colon:
                return self._plain(400, "bad header line\n")
            headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            return self._plain(405, "only GET\n", "Allow: GET, HEAD\r\n")
        auth = self.security.basic_auth
        if auth is not None and not auth.accepts(headers.get("authorization", "")):
            return self._plain(
                401, "credentials needed\n", 'WWW-Authenticate: Basic realm="airgossip"\r\n'
            )
        route = self.routes.get(target.split("?", 1)[0])
        if route is None:
            return self._plain(404, "not found\n")
        loop = asyncio.get_running_loop()
        try:
            status, content_type, body = await loop.run_in_executor(
                self._pool, route, headers.get("accept", "")
            )
        except Exception as err:  # a route that fails is the server's fault, said in one line
            log.warning("metrics HTTP route %s failed: %s", target[:64], err)
            return self._plain(500, "internal error\n")
        return _head(status, content_type, len(body)) + (body if method == "GET" else b"")

    @staticmethod
    def _plain(status: int, text: str, extra: str = "") -> bytes:
        body = text.encode()
        return _head(status, "text/plain; charset=utf-8", len(body), extra) + body

    def stop(self) -> None:
        """Stop serving and close every connection."""
        loop = self._loop
        if loop is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=10.0)
        self._sock.close()
        self._pool.shutdown(wait=False)
