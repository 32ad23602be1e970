"""Transport security: mutual TLS credentials, and the identities they prove.

Every link of a fleet (agent to agent, agent to coordinator) is mutual TLS unless the operator asks
for plaintext (``--insecure``). A fleet has one certificate authority; each member holds a
certificate and key issued by it (see :mod:`airgossip.common.security.certificates` and ``airgossip
certs``).

**The identity** of a member is its certificate's URI subject alternative name
``airgossip:<id>`` (exactly one): an agent's id (``agent-3``) or ``coordinator``. Servers read
it from the TLS handshake and bind every request to it: a gossip message whose sender is not
the certificate's identity, or a coordinator call for another agent, is refused. The same
certificate also names ``<id>`` as a DNS name. It is not a host name: a client dials a peer
by address and sets gRPC's target-name override to the id it expects, so gRPC's own host-name
check proves it reached that member, whatever its address (devices move, addresses change).

A certificate that has expired, is not yet valid or was issued by another authority never
gets past the handshake; the client sees ``UNAVAILABLE``, the server nothing at all.

``None`` in place of :class:`TlsCredentials` means plaintext throughout: :func:`dial`,
:func:`add_port` and :func:`peer_identity` take either, so callers keep one code path.
"""

from __future__ import annotations

import datetime
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

#: How a certificate names its holder: the URI subject alternative name ``airgossip:<id>``.
IDENTITY_URI_PREFIX = "airgossip:"
#: The coordinator's identity.
COORDINATOR_IDENTITY = "coordinator"
#: A DNS name every member's certificate carries besides its own id: the ``server_name`` a
#: scraper verifies metrics endpoints against when it finds them by service discovery (one
#: name for every target; it proves a member of the fleet, not which one).
METRICS_NAME = "airgossip-metrics"
#: Identities double as DNS names in certificates (see the module docstring): letters,
#: digits, dots, underscores and hyphens, starting with a letter or digit, at most 63.
IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
#: File names in a credentials folder: the CA's certificate (and, where certificates are
#: issued, its key), then ``<id>.pem`` and ``<id>.key`` per member.
CA_CERT = "ca.pem"
CA_KEY = "ca.key"


class SecurityError(ValueError):
    """Credentials that cannot be used (missing, unreadable, for another id, expired...)."""


def check_identity(identity: str) -> str:
    """``identity`` if it can name a certificate's holder; :class:`SecurityError` if not."""
    if not IDENTITY.fullmatch(identity):
        raise SecurityError(
            f"{identity[:80]!r} cannot be a certificate identity: 1-63 letters, digits, "
            "'.', '_' or '-', starting with a letter or digit"
        )
    return identity


def certificate_identity(cert: x509.Certificate) -> str | None:
    """The identity a certificate names (its single ``airgossip:`` URI), or None."""
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    uris = [
        u[len(IDENTITY_URI_PREFIX) :]
        for u in names.get_values_for_type(x509.UniformResourceIdentifier)
        if u.startswith(IDENTITY_URI_PREFIX)
    ]
    return uris[0] if len(uris) == 1 else None


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise SecurityError(f"{what} {path} does not exist") from None
    except OSError as err:
        raise SecurityError(f"cannot read {what} {path}: {err.strerror}") from None


def _certificate(data: bytes, path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise SecurityError(f"{path} is not a PEM certificate") from None


@dataclass(frozen=True)
class TlsCredentials:
    """One member's mutual-TLS credentials: the fleet's CA, its certificate and key.

    Build with :meth:`load`, which checks everything that would otherwise fail later as an
    unexplained handshake error.
    """

    identity: str
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    @classmethod
    def load(cls, directory: Path, identity: str) -> TlsCredentials:
        """Read ``ca.pem``, ``<identity>.pem`` and ``<identity>.key`` from ``directory``.

        Raises
        ------
        SecurityError
            A file is missing or unreadable, the certificate names another identity, was not
            issued by the CA, is not valid now, or does not match the key.
        """
        check_identity(identity)
        ca_path, cert_path = directory / CA_CERT, directory / f"{identity}.pem"
        key_path = directory / f"{identity}.key"
        ca_pem = _read(ca_path, "CA certificate")
        cert_pem = _read(cert_path, "certificate")
        key_pem = _read(key_path, "private key")
        ca, cert = _certificate(ca_pem, ca_path), _certificate(cert_pem, cert_path)
        named = certificate_identity(cert)
        if named != identity:
            raise SecurityError(
                f"{cert_path} is for {named!r}, not {identity!r}"
                if named
                else f"{cert_path} names no airgossip identity (a URI airgossip:<id>)"
            )
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            raise SecurityError(f"{cert_path} was not issued by the CA in {ca_path}") from None
        now = datetime.datetime.now(datetime.timezone.utc)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise SecurityError(
                f"{cert_path} is valid from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} to "
                f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, not now; issue a new one "
                "(airgossip certs issue)"
            )
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError):
            raise SecurityError(f"{key_path} is not an unencrypted PEM private key") from None
        if key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ) != cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ):
            raise SecurityError(f"{key_path} is not the key of {cert_path}")
        return cls(identity, ca_pem, cert_pem, key_pem)

    @property
    def fleet(self) -> str:
        """The fleet's name on the wire: the first 16 hex digits of the SHA-256 of its CA
        certificate (members of one fleet share it; another CA is another fleet)."""
        ca = x509.load_pem_x509_certificate(self.ca_pem)
        return hashlib.sha256(ca.public_bytes(serialization.Encoding.DER)).hexdigest()[:16]

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server side: present this certificate, require one from every client."""
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client side: trust only the fleet's CA, present this certificate."""
        return grpc.ssl_channel_credentials(self.ca_pem, self.key_pem, self.cert_pem)


def fleet_of(security: TlsCredentials | None) -> str:
    """The fleet name messages carry: the CA's fingerprint with TLS, empty without."""
    return security.fleet if security is not None else ""


def dial(
    address: str,
    peer: str,
    security: TlsCredentials | None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A channel to ``peer`` (its identity) at ``address``; plaintext when ``security`` is None.

    With TLS the channel only connects if the server's certificate names ``peer``.
    """
    if security is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(
        address,
        security.channel_credentials(),
        options=[*options, ("grpc.ssl_target_name_override", peer)],
    )


def add_port(server: grpc.Server, listen: str, security: TlsCredentials | None) -> int:
    """Bind ``server`` to ``listen`` with TLS (or plaintext); the bound port, 0 on failure."""
    if security is None:
        return int(server.add_insecure_port(listen))
    return int(server.add_secure_port(listen, security.server_credentials()))


def peer_identity(context: grpc.ServicerContext) -> str | None:
    """The identity of the client's certificate, or None if it names none (or no TLS)."""
    values = context.auth_context().get("peer_uri", ())
    prefix = IDENTITY_URI_PREFIX.encode()
    found = [bytes(v[len(prefix) :]) for v in values if v.startswith(prefix)]
    if len(found) != 1:
        return None
    try:
        return found[0].decode("ascii")
    except UnicodeDecodeError:
        return None
