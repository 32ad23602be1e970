"""Issuing a fleet's certificates: one authority per fleet, one certificate per member.

``airgossip certs init`` makes the authority (``ca.pem`` and ``ca.key``), ``airgossip certs
issue ID`` a member's certificate (``ID.pem``) and key (``ID.key``); ``airgossip run`` makes a
throwaway authority in its run folder. Keys are ECDSA P-256, written owner-readable only; a
certificate names its holder as :mod:`airgossip.common.security.tls` reads it (the URI
``airgossip:<id>`` and the DNS name ``<id>``, plus the fleet-wide name ``airgossip-metrics`` its
metrics endpoint is scraped by) and is good for both ends of a TLS connection (every agent serves
and dials). It also carries the member's X25519 key-agreement key
(:mod:`airgossip.common.security.agreement`), which pairs of agents use for secrets of their own.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from airgossip.common.security.agreement import agreement_name
from airgossip.common.security.private_files import private_folder, write_private
from airgossip.common.security.tls import (
    CA_CERT,
    CA_KEY,
    IDENTITY_URI_PREFIX,
    METRICS_NAME,
    SecurityError,
    check_identity,
)

#: Clocks of devices drift: certificates are valid from a little before they are issued.
CLOCK_SKEW = datetime.timedelta(minutes=5)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_authority(
    name: str = "airgossip fleet", *, days: float = 3650
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new self-signed certificate authority (in memory)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def make_certificate(
    authority: x509.Certificate,
    authority_key: ec.EllipticCurvePrivateKey,
    identity: str,
    *,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
    days: float = 365,
) -> tuple[bytes, bytes]:
    """``(certificate PEM, key PEM)`` for ``identity``, signed by ``authority`` (in memory).

    ``not_before``/``not_after`` override the validity window (tests make expired ones).
    """
    check_identity(identity)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    start = not_before if not_before is not None else now - CLOCK_SKEW
    end = not_after if not_after is not None else now + datetime.timedelta(days=days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .issuer_name(authority.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.UniformResourceIdentifier(f"{IDENTITY_URI_PREFIX}{identity}"),
                    x509.DNSName(identity),
                    x509.DNSName(METRICS_NAME),
                    # The member's key-agreement key, for pairwise secrets.
                    agreement_name(key),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority_key.public_key()),
            critical=False,
        )
        .sign(authority_key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def _write(path: Path, data: bytes, *, secret: bool, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise SecurityError(f"{path} already exists; remove it first (or pass --force)")
    # Folders it makes are private (0700) whatever the umask; one the user made keeps its mode.
    private_folder(path.parent, tighten=False)
    if secret:
        write_private(path, data)
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)  # a stale one (or a link planted there) is not written through
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o644)  # a certificate is public: the umask decides
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def init_authority(
    directory: Path, *, name: str = "airgossip fleet", days: float = 3650, overwrite: bool = False
) -> Path:
    """Create ``ca.pem`` and ``ca.key`` in ``directory``; return the certificate's path."""
    cert, key = make_authority(name, days=days)
    _write(directory / CA_KEY, _key_pem(key), secret=True, overwrite=overwrite)
    _write(directory / CA_CERT, _cert_pem(cert), secret=False, overwrite=overwrite)
    return directory / CA_CERT


def load_authority(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The authority in ``directory`` (``ca.pem`` and ``ca.key``); :class:`SecurityError`."""
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except FileNotFoundError as err:
        raise SecurityError(
            f"no certificate authority in {directory} ({err.filename} is missing); "
            "create one with `airgossip certs init`"
        ) from None
    except (OSError, ValueError, TypeError) as err:
        raise SecurityError(
            f"cannot read the certificate authority in {directory}: {err}"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise SecurityError(f"{key_path} is not an ECDSA key")
    return cert, key


def issue(
    directory: Path,
    identity: str,
    *,
    out: Path | None = None,
    days: float = 365,
    overwrite: bool = False,
) -> tuple[Path, Path]:
    """Issue ``identity``'s certificate and key from the authority in ``directory``.

    They go to ``out`` (default ``directory``) as ``<identity>.pem`` and ``<identity>.key``,
    with a copy of ``ca.pem`` when ``out`` is another folder, so that ``out`` is all a
    device needs. Returns both paths.
    """
    authority, key = load_authority(directory)
    cert_pem, key_pem = make_certificate(authority, key, identity, days=days)
    target = out or directory
    cert_path, key_path = target / f"{identity}.pem", target / f"{identity}.key"
    _write(key_path, key_pem, secret=True, overwrite=overwrite)
    _write(cert_path, cert_pem, secret=False, overwrite=overwrite)
    if target.resolve() != directory.resolve():
        ca = (directory / CA_CERT).read_bytes()
        if not (target / CA_CERT).exists() or (target / CA_CERT).read_bytes() != ca:
            _write(target / CA_CERT, ca, secret=False, overwrite=True)
    return cert_path, key_path


def throwaway_fleet(directory: Path, identities: Iterable[str], *, days: float = 7) -> Path:
    """A fresh authority in ``directory`` and a certificate for each of ``identities``
    (``airgossip run``: a run's credentials live and die with its folder)."""
    authority, key = make_authority("airgossip run", days=days)
    _write(directory / CA_KEY, _key_pem(key), secret=True, overwrite=True)
    _write(directory / CA_CERT, _cert_pem(authority), secret=False, overwrite=True)
    for identity in identities:
        cert_pem, key_pem = make_certificate(authority, key, identity, days=days)
        _write(directory / f"{identity}.key", key_pem, secret=True, overwrite=True)
        _write(directory / f"{identity}.pem", cert_pem, secret=False, overwrite=True)
    return directory
