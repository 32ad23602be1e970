"""Cancelling masks: keys agreed over the fleet's certificates (authenticated, refused when
they cannot be), masks that sum to zero across every pair and over the fleet, Gaussian and
fresh every round."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from airgossip.common.security.agreement import AGREEMENT_URI_PREFIX, agreement_public_key
from airgossip.common.security.certificates import make_authority, make_certificate, throwaway_fleet
from airgossip.common.security.tls import SecurityError, TlsCredentials
from airgossip.common.topology import build_graph
from airgossip.edge.privacy.keys import CertificateSecrets, RunKeyring
from airgossip.edge.privacy.masks import PairMasks, gaussian_stream
from airgossip.edge.privacy.plan import PrivacyGraph

IDS = [f"agent-{i}" for i in range(6)]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return throwaway_fleet(tmp_path_factory.mktemp("certs"), IDS)


def secrets(certs: Path, identity: str) -> CertificateSecrets:
    return CertificateSecrets(TlsCredentials.load(certs, identity), certs)


def test_both_ends_of_a_pair_agree_a_key_nobody_else_computes(certs: Path) -> None:
    a, b, c = (secrets(certs, i) for i in IDS[:3])
    key = a.mask_key("agent-1", b"run")
    assert len(key) == 32
    assert b.mask_key("agent-0", b"run") == key
    assert c.mask_key("agent-0", b"run") != key and c.mask_key("agent-1", b"run") != key
    assert a.mask_key("agent-1", b"another run") != key


def test_a_partner_is_authenticated_by_the_fleet_authority(certs: Path, tmp_path: Path) -> None:
    mine = secrets(certs, "agent-0")
    # A certificate for agent-1 from another authority, dropped in the folder: refused.
    other, other_key = make_authority("intruder")
    forged, _ = make_certificate(other, other_key, "agent-1")
    for name in ("ca.pem", "agent-0.pem", "agent-0.key"):
        (tmp_path / name).write_bytes((certs / name).read_bytes())
    (tmp_path / "agent-1.pem").write_bytes(forged)
    swapped = CertificateSecrets(TlsCredentials.load(tmp_path, "agent-0"), tmp_path)
    with pytest.raises(SecurityError, match=r"was not issued by this fleet's ca\.pem"):
        swapped.mask_key("agent-1", b"run")
    with pytest.raises(SecurityError, match="no certificate of partner 'agent-9'"):
        mine.mask_key("agent-9", b"run")
    (tmp_path / "agent-2.pem").write_bytes((certs / "agent-1.pem").read_bytes())
    with pytest.raises(SecurityError, match="does not name 'agent-2'"):
        swapped.mask_key("agent-2", b"run")


def test_certificates_from_before_key_agreement_are_refused_with_a_way_out(
    certs: Path, tmp_path: Path
) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    cert = x509.load_pem_x509_certificate((certs / "agent-0.pem").read_bytes())
    assert agreement_public_key(cert) is not None
    # The same certificate without the key-agreement name (as issued before it existed).
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    kept = [n for n in names if not str(n.value).startswith(AGREEMENT_URI_PREFIX)]
    assert len(kept) == len(list(names)) - 1
    authority, key = make_authority("old fleet")
    builder = x509.CertificateBuilder().subject_name(cert.subject).issuer_name(authority.subject)
    builder = builder.public_key(cert.public_key()).serial_number(cert.serial_number)
    builder = builder.not_valid_before(cert.not_valid_before_utc)
    builder = builder.not_valid_after(cert.not_valid_after_utc)
    builder = builder.add_extension(x509.SubjectAlternativeName(kept), critical=False)
    old = builder.sign(key, hashes.SHA256())
    (tmp_path / "ca.pem").write_bytes(authority.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "agent-0.pem").write_bytes(old.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "agent-0.key").write_bytes((certs / "agent-0.key").read_bytes())
    with pytest.raises(SecurityError, match=r"carries no key-agreement key .* issue the fleet's"):
        CertificateSecrets(TlsCredentials.load(tmp_path, "agent-0"), tmp_path)


def test_cancelling_noise_sums_to_zero_across_an_edge_pair_and_over_the_fleet(
    certs: Path,
) -> None:
    graph = PrivacyGraph.of(build_graph("exponential", 6), tuple(IDS), "column-stochastic",
                          static=True)  # fmt: skip
    numel = 5000
    keys = {i: secrets(certs, i) for i in IDS}
    masks = {
        i: PairMasks(i, graph.partners(i), lambda p, me=i: keys[me].mask_key(p, b"r"), numel)
        for i in IDS
    }
    for round_index in (1, 2, 77):
        for me in IDS:
            for peer in masks[me].partners:
                mine = masks[me].pair_mask(peer, round_index, 3.0)
                theirs = masks[peer].pair_mask(me, round_index, 3.0)
                scale = float(torch.linalg.vector_norm(mine))
                assert scale > 100  # a real mask: 3 * sqrt(5000) ~ 212
                assert float(torch.linalg.vector_norm(mine + theirs)) <= 1e-9 * scale
        fleet = sum(masks[i].mask(round_index, 3.0) for i in IDS)
        each = float(torch.linalg.vector_norm(masks["agent-0"].mask(round_index, 3.0)))
        assert float(torch.linalg.vector_norm(fleet)) <= 1e-9 * each
    # Fresh every round; independent of the other pairs.
    one = masks["agent-0"].pair_mask("agent-1", 1, 1.0)
    two = masks["agent-0"].pair_mask("agent-1", 2, 1.0)
    other = masks["agent-0"].pair_mask("agent-2", 1, 1.0)
    assert abs(float(torch.corrcoef(torch.stack([one, two]))[0, 1])) < 0.05
    assert abs(float(torch.corrcoef(torch.stack([one, other]))[0, 1])) < 0.05


def test_the_stream_is_standard_normal_and_a_pure_function_of_key_and_round() -> None:
    values = gaussian_stream(bytes(range(32)), 3, 200_001)
    assert values.shape == (200_001,)
    assert abs(values.mean()) < 0.01 and values.std() == pytest.approx(1.0, abs=0.01)
    assert np.mean(np.abs(values) < 1.0) == pytest.approx(0.6827, abs=0.005)
    assert np.array_equal(values, gaussian_stream(bytes(range(32)), 3, 200_001))
    assert not np.array_equal(values[:10], gaussian_stream(bytes(range(32)), 4, 10))


def test_in_process_fleets_derive_keys_from_the_seed() -> None:
    first, second = RunKeyring(IDS, seed=1), RunKeyring(IDS, seed=2)
    a, b = first.for_agent("agent-0"), first.for_agent("agent-3")
    assert a.mask_key("agent-3", b"r") == b.mask_key("agent-0", b"r")
    assert second.for_agent("agent-0").mask_key("agent-3", b"r") != a.mask_key("agent-3", b"r")
    same = RunKeyring(IDS, seed=1).for_agent("agent-0")  # the same run again: the same masks
    assert same.mask_key("agent-3", b"r") == a.mask_key("agent-3", b"r")
    assert first.for_agent("agent-1").mask_key("agent-3", b"r") != a.mask_key("agent-3", b"r")
    with pytest.raises(SecurityError, match="'agent-9' has no key in this run"):
        a.mask_key("agent-9", b"r")
    assert "agent-3" in repr(PairMasks("agent-0", ["agent-3"], lambda p: bytes(32), 4))
    assert "\\x00" not in repr(PairMasks("agent-0", ["agent-3"], lambda p: bytes(32), 4))
