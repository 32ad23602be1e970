"""Mutual TLS on plain sockets with a member's fleet credentials (Python's :mod:`ssl`).

gRPC speaks TLS through its own stack; a raw data connection (the bulk path of
:mod:`airgossip.edge.transport.bulk`) uses the same certificate authority, certificate and key
through OpenSSL here: both ends present their certificate, each trusts only the fleet's CA, and the
identity checked is the certificate's ``airgossip:<id>`` URI, as gRPC's ``peer_identity`` checks it
(the host name plays no part: agents are dialled by address).
"""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path

from airgossip.common.security.tls import IDENTITY_URI_PREFIX, TlsCredentials


def ssl_context(security: TlsCredentials, *, server: bool) -> ssl.SSLContext:
    """A context presenting ``security``'s certificate and requiring one of the fleet's CA
    from the other end (TLS 1.2 at least)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False  # the identity is the URI name, checked by peer_identity
    context.verify_mode = ssl.CERT_REQUIRED
    if server:
        context.num_tickets = 0  # no resumption: a connection per push, nothing left unread
    context.load_verify_locations(cadata=security.ca_pem.decode("ascii"))
    # OpenSSL loads a certificate and key only from files: a private folder, gone at once.
    with tempfile.TemporaryDirectory(prefix="airgossip-tls-") as folder:
        cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        for path, data in ((cert, security.cert_pem), (key, security.key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        context.load_cert_chain(cert, key)
    return context


def ssl_identity(sock: ssl.SSLSocket) -> str | None:
    """The identity the peer's (verified) certificate names, or None if it names none or
    more than one."""
    cert = sock.getpeercert() or {}
    alt_names: tuple[tuple[str, str], ...] = cert.get("subjectAltName", ())  # type: ignore[assignment]
    names = [
        value[len(IDENTITY_URI_PREFIX) :]
        for kind, value in alt_names
        if kind == "URI" and value.startswith(IDENTITY_URI_PREFIX)
    ]
    return names[0] if len(names) == 1 else None
