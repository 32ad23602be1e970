"""Pairwise secrets for cancelling masks: an authenticated X25519 key agreement between the
two agents of every pair, over the identities they already hold.

**With TLS credentials** (every fleet of processes, devices, containers). An agent's
X25519 key is derived from its certificate's private key (HKDF-SHA256; no new key file), and
its public half is in its certificate, as a name the fleet's authority signs with the rest
(``airgossip.common.security.agreement``, added by ``airgossip certs`` and ``airgossip run``). An
agent reads a partner's certificate (public) beside its own (``<peer>.pem``), or in a run
folder from the partner's folder next to its own (``certs/<peer>/<peer>.pem``), checks that
the fleet's authority issued it to that identity and that it is valid now, and agrees a
secret with the key in it. Nobody else can compute the secret; nothing of it is
ever sent. Certificates issued before this name existed are refused with a line that says
to issue new ones.

**In-process fleets** (``inproc``, ``virtual``: one process, no TLS): every agent gets an
X25519 key derived from the run's seed (:class:`RunKeyring`), so that a run is as
deterministic as every other; agents use each other's public keys only. The process is the
trust boundary there: whoever reads its memory, or has the scenario, has the keys.

Either way the pair's mask key is ``HKDF(X25519 secret, salt = the pair's ids, info = the
run's context)``: the context holds the fleet's seed and digest, so two runs of one fleet
with different seeds get unrelated masks.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from airgossip.common.identity import natural_key
from airgossip.common.security.agreement import agreement_key, agreement_public_key
from airgossip.common.security.tls import (
    CA_CERT,
    SecurityError,
    TlsCredentials,
    certificate_identity,
)

_MASK_INFO = b"airgossip cancelling masks v1"
_RUN_KEYS = b"airgossip in-process run keys v1"


def mask_key(shared: bytes, me: str, peer: str, context: bytes) -> bytes:
    """The 32-byte key of the pair's masks from their X25519 secret (same at both ends)."""
    first, second = sorted((me, peer), key=natural_key)
    salt = f"{first}\x00{second}".encode()
    return HKDF(hashes.SHA256(), 32, salt=salt, info=_MASK_INFO + b"\x00" + context).derive(shared)


class PairSecrets(Protocol):
    """Where an agent's pairwise mask keys come from."""

    identity: str

    def mask_key(self, peer: str, context: bytes) -> bytes:
        """The key this agent shares with ``peer`` for the run ``context``; never logged,
        never sent. Raises :class:`~airgossip.common.security.tls.SecurityError` when ``peer``
        cannot be authenticated."""


class CertificateSecrets:
    """Pair secrets from TLS credentials: this agent's key, its partners' certificates in
    ``directory`` (see the module docstring)."""

    def __init__(self, credentials: TlsCredentials, directory: Path) -> None:
        self.identity = credentials.identity
        self._ca = x509.load_pem_x509_certificate(credentials.ca_pem)
        own = x509.load_pem_x509_certificate(credentials.cert_pem)
        if agreement_public_key(own) is None:
            raise SecurityError(_no_key(directory / f"{self.identity}.pem"))
        key = serialization.load_pem_private_key(credentials.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise SecurityError(f"the key of {self.identity} is not an ECDSA key")
        self._key = agreement_key(key)
        self._directory = directory

    def _certificate_path(self, peer: str) -> Path:
        """Where ``peer``'s certificate is: beside this agent's own (a device's folder), or in
        the peer's own folder next to this agent's (a run folder: ``certs/<id>/``)."""
        beside = self._directory / f"{peer}.pem"
        if beside.exists():
            return beside
        sibling = self._directory.parent / peer / f"{peer}.pem"
        if self._directory.name == self.identity and sibling.exists():
            return sibling
        raise SecurityError(
            f"cancelling masks: no certificate of partner '{peer}' at {beside} (every agent "
            f"needs its partners' certificates, <id>.pem, beside its own)"
        )

    def _peer_key(self, peer: str) -> X25519PublicKey:
        path = self._certificate_path(peer)
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except (OSError, ValueError) as err:
            raise SecurityError(f"cannot read partner '{peer}''s {path}: {err}") from None
        if certificate_identity(cert) != peer:
            raise SecurityError(f"{path} does not name '{peer}'")
        try:
            cert.verify_directly_issued_by(self._ca)
        except (ValueError, TypeError, InvalidSignature):
            raise SecurityError(f"{path} was not issued by this fleet's {CA_CERT}") from None
        now = datetime.datetime.now(datetime.timezone.utc)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise SecurityError(f"{path} is not valid now")
        public = agreement_public_key(cert)
        if public is None:
            raise SecurityError(_no_key(path))
        return public

    def mask_key(self, peer: str, context: bytes) -> bytes:
        return mask_key(self._key.exchange(self._peer_key(peer)), self.identity, peer, context)


def _no_key(path: Path) -> str:
    return (
        f"{path} carries no key-agreement key (issued before cancelling masks existed); "
        "issue the fleet's certificates again (airgossip certs issue)"
    )


class RunSecrets:
    """Pair secrets of one agent of an in-process fleet (see :class:`RunKeyring`)."""

    def __init__(
        self, identity: str, key: X25519PrivateKey, directory: Mapping[str, X25519PublicKey]
    ) -> None:
        self.identity = identity
        self._key = key
        self._directory = directory

    def mask_key(self, peer: str, context: bytes) -> bytes:
        public = self._directory.get(peer)
        if public is None:
            raise SecurityError(f"cancelling masks: '{peer}' has no key in this run")
        return mask_key(self._key.exchange(public), self.identity, peer, context)


class RunKeyring:
    """X25519 keys for every agent of an in-process run, derived from the run's seed (an
    in-process run is a simulation, deterministic for its seed like every other draw; the
    process is the trust boundary, and whoever has the scenario can compute the keys): each
    agent gets its own private key and everyone's public keys (:meth:`for_agent`)."""

    def __init__(self, ids: Iterable[str], *, seed: int) -> None:
        self._private = {
            i: X25519PrivateKey.from_private_bytes(
                hashlib.blake2b(f"{seed}\x00{i}".encode(), key=_RUN_KEYS, digest_size=32).digest()
            )
            for i in ids
        }
        self._public = {i: k.public_key() for i, k in self._private.items()}

    def for_agent(self, identity: str) -> RunSecrets:
        return RunSecrets(identity, self._private[identity], self._public)
