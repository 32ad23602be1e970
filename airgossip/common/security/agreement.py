"""Key agreement keys of a fleet's members, bound to their certificates.

A member's X25519 key is derived from its certificate's ECDSA key (HKDF-SHA256 of the
scalar: no second key file to keep), and its public half rides in the certificate as a
second URI subject alternative name, ``airgossip-x25519:<key, base64url>``, which the fleet's
authority signs with the rest. A partner's certificate then authenticates the key it
agrees a secret with (``airgossip.edge.privacy.keys``). A name rather than an extension of its own:
every TLS stack parses names (Prometheus's Go one refuses an object identifier whose arcs
do not fit 64 bits, as a UUID-based one does), and a name that is not ``airgossip:<id>``
identifies nobody (:func:`airgossip.common.security.tls.certificate_identity`).
"""

from __future__ import annotations

import base64
import binascii

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: How a certificate carries its member's X25519 public key: a URI subject alternative name.
AGREEMENT_URI_PREFIX = "airgossip-x25519:"
_DERIVE_INFO = b"airgossip x25519 key agreement v1"


def agreement_key(identity_key: ec.EllipticCurvePrivateKey) -> X25519PrivateKey:
    """The X25519 key derived from a member's certificate key (HKDF-SHA256 of its scalar)."""
    scalar = identity_key.private_numbers().private_value.to_bytes(32, "big")
    seed = HKDF(hashes.SHA256(), 32, salt=None, info=_DERIVE_INFO).derive(scalar)
    return X25519PrivateKey.from_private_bytes(seed)


def agreement_name(identity_key: ec.EllipticCurvePrivateKey) -> x509.UniformResourceIdentifier:
    """The subject alternative name a certificate carries for key agreement."""
    public = (
        agreement_key(identity_key)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    encoded = base64.urlsafe_b64encode(public).rstrip(b"=").decode()
    return x509.UniformResourceIdentifier(f"{AGREEMENT_URI_PREFIX}{encoded}")


def agreement_public_key(cert: x509.Certificate) -> X25519PublicKey | None:
    """The X25519 public key a certificate carries (exactly one), or None."""
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    keys = [
        u[len(AGREEMENT_URI_PREFIX) :]
        for u in names.get_values_for_type(x509.UniformResourceIdentifier)
        if u.startswith(AGREEMENT_URI_PREFIX)
    ]
    if len(keys) != 1:
        return None
    try:
        raw = base64.urlsafe_b64decode(keys[0] + "=" * (-len(keys[0]) % 4))
    except (binascii.Error, ValueError):
        return None
    return X25519PublicKey.from_public_bytes(raw) if len(raw) == 32 else None
