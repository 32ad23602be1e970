"""Whether an address can be listened on, said in one sentence (gRPC only logs a failed bind)."""

from __future__ import annotations

import errno
import socket


class PortInUseError(OSError):
    """The address to listen on is taken (or cannot be bound)."""


def split_listen(listen: str, doing: str = "listen") -> tuple[str, int]:
    """``host:port`` (brackets of an IPv6 host removed) as host and port, or
    :class:`PortInUseError` saying what is wrong: "cannot ``doing`` on ``listen``: ..."."""
    host, _, port_text = listen.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise PortInUseError(f"cannot {doing} on {listen}: expected host:port") from None
    if not 0 <= port <= 65535:
        raise PortInUseError(f"cannot {doing} on {listen}: port must be within 0..65535")
    return host.strip("[]"), port


def ensure_bindable(listen: str) -> None:
    """Raise :class:`PortInUseError` with a plain reason if ``host:port`` cannot be bound.

    gRPC reports a failed bind only as a log line on stderr and a zero port; trying the
    address with a plain socket first gives the user one clear sentence instead.
    """
    host, port = split_listen(listen)
    host = host or "0.0.0.0"
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
