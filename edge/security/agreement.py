"""Key agreement keys of a fleet's members, bound to their certificates.

A member's X25519 key is derived from its certificate's ECDSA key (HKDF-SHA256 of the
scalar: no second key file to keep), and its public half rides in the certificate, in an
extension the fleet's authority signs with the rest. A partner's certificate then
authenticates the key it agrees a secret with (``edge.privacy.keys``).
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: The certificate extension that carries a member's X25519 public key (an OID under the
#: UUID arc 2.25, which needs no registration; the value is a DER OCTET STRING of 32 bytes).
AGREEMENT_OID = x509.ObjectIdentifier("2.25.247788561532925004963313451618305795613")
_DERIVE_INFO = b"airgossip x25519 key agreement v1"


def agreement_key(identity_key: ec.EllipticCurvePrivateKey) -> X25519PrivateKey:
    """The X25519 key derived from a member's certificate key (HKDF-SHA256 of its scalar)."""
    scalar = identity_key.private_numbers().private_value.to_bytes(32, "big")
    seed = HKDF(hashes.SHA256(), 32, salt=None, info=_DERIVE_INFO).derive(scalar)
    return X25519PrivateKey.from_private_bytes(seed)


def agreement_extension(identity_key: ec.EllipticCurvePrivateKey) -> x509.UnrecognizedExtension:
    """The extension a certificate carries for key agreement (see the module docstring)."""
    public = (
        agreement_key(identity_key)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    return x509.UnrecognizedExtension(AGREEMENT_OID, b"\x04\x20" + public)


def agreement_public_key(cert: x509.Certificate) -> X25519PublicKey | None:
    """The X25519 public key a certificate carries, or None."""
    try:
        value = cert.extensions.get_extension_for_oid(AGREEMENT_OID).value
    except x509.ExtensionNotFound:
        return None
    raw = getattr(value, "value", b"")
    if len(raw) != 34 or raw[:2] != b"\x04\x20":
        return None
    return X25519PublicKey.from_public_bytes(raw[2:])
