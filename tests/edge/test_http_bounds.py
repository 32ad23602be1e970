"""The metrics HTTP server under idle and slow clients: threads bounded, idle connections
dropped after the timeout, scrapes answered again once they are gone."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

import edge.observability.metrics
from edge.observability.metrics import MAX_CONNECTIONS, MetricsServer


def test_idle_clients_hold_a_bounded_number_of_threads_and_time_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(edge.observability.metrics, "REQUEST_TIMEOUT_S", 1.0)
    server = MetricsServer(CollectorRegistry(), "127.0.0.1:0")
    server.start()
    host, port = server.address.rsplit(":", 1)
    before = threading.active_count()
    idle = [socket.create_connection((host, int(port))) for _ in range(3 * MAX_CONNECTIONS)]
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= MAX_CONNECTIONS
        for sock in idle[:5]:  # half a request, never finished (slowloris)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        time.sleep(2.0)  # past the timeout: the server has dropped every one of them
        for sock in idle:
            sock.settimeout(2.0)
            with contextlib.suppress(ConnectionResetError):  # dropped, one way or the other
                assert sock.recv(1) == b""
        assert threading.active_count() - before <= 1
        url = f"http://{server.address}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            assert reply.status == 200
    finally:
        for sock in idle:
            sock.close()
        server.stop()
