"""The bulk path's data connections: mutual TLS on plain sockets, real sockets on loopback."""

from __future__ import annotations

import socket
import ssl
import threading

import pytest

from edge.transport.tlssocket import ssl_context, ssl_identity
from tests.support.tls import credentials

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
