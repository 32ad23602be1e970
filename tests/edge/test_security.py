"""Loading TLS credentials: everything that would otherwise fail as an unexplained
handshake error is refused up front, in one sentence."""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import pytest

from airgossip.common.security.certificates import (
    init_authority,
    issue,
    load_authority,
    make_certificate,
)
from airgossip.common.security.tls import SecurityError, TlsCredentials, check_identity, fleet_of


@pytest.fixture
def authority(tmp_path: Path) -> Path:
    folder = tmp_path / "ca"
    init_authority(folder)
    issue(folder, "agent-1")
    return folder


def test_issued_credentials_load_and_name_their_fleet(authority: Path, tmp_path: Path) -> None:
    creds = TlsCredentials.load(authority, "agent-1")
    assert creds.identity == "agent-1" and len(creds.fleet) == 16
    device = tmp_path / "device"
    issue(authority, "agent-2", out=device)  # what one device needs, and nothing more
    assert sorted(p.name for p in device.iterdir()) == ["agent-2.key", "agent-2.pem", "ca.pem"]
    assert (device / "agent-2.key").stat().st_mode & 0o077 == 0
    assert TlsCredentials.load(device, "agent-2").fleet == creds.fleet
    other = tmp_path / "other"
    init_authority(other)
    issue(other, "agent-1")
    assert TlsCredentials.load(other, "agent-1").fleet != creds.fleet
    assert fleet_of(None) == ""


def test_unusable_credentials_are_refused_with_a_reason(authority: Path, tmp_path: Path) -> None:
    with pytest.raises(SecurityError, match=r"agent-9\.pem does not exist"):
        TlsCredentials.load(authority, "agent-9")
    # a certificate copied under another name
    shutil.copy(authority / "agent-1.pem", authority / "agent-2.pem")
    shutil.copy(authority / "agent-1.key", authority / "agent-2.key")
    with pytest.raises(SecurityError, match="is for 'agent-1', not 'agent-2'"):
        TlsCredentials.load(authority, "agent-2")
    # another authority's certificate
    other = tmp_path / "other"
    init_authority(other)
    issue(other, "agent-3")
    for name in ("agent-3.pem", "agent-3.key"):
        shutil.copy(other / name, authority / name)
    with pytest.raises(SecurityError, match="was not issued by the CA"):
        TlsCredentials.load(authority, "agent-3")
    # expired
    ca, key = load_authority(authority)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert, private = make_certificate(ca, key, "agent-4", not_before=now - datetime.timedelta(3),
                                     not_after=now - datetime.timedelta(1))  # fmt: skip
    (authority / "agent-4.pem").write_bytes(cert)
    (authority / "agent-4.key").write_bytes(private)
    with pytest.raises(SecurityError, match="not now; issue a new one"):
        TlsCredentials.load(authority, "agent-4")
    # a key that is not the certificate's
    shutil.copy(authority / "agent-4.key", authority / "agent-1.key")
    with pytest.raises(SecurityError, match=r"agent-1\.key is not the key of"):
        TlsCredentials.load(authority, "agent-1")
    (authority / "agent-1.pem").write_text("not a certificate")
    with pytest.raises(SecurityError, match="is not a PEM certificate"):
        TlsCredentials.load(authority, "agent-1")


def test_identities_are_checked_and_files_never_overwritten(authority: Path) -> None:
    for bad in ("", "-x", "a b", "x" * 64, "a:b"):
        with pytest.raises(SecurityError, match="cannot be a certificate identity"):
            check_identity(bad)
    with pytest.raises(SecurityError, match="already exists"):
        issue(authority, "agent-1")
    with pytest.raises(SecurityError, match="already exists"):
        init_authority(authority)
    issue(authority, "agent-1", overwrite=True)
    with pytest.raises(SecurityError, match="airgossip certs init"):
        issue(authority / "nowhere", "agent-1")
