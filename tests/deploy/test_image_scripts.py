"""The image's helper scripts, run here as the image runs them: ``fleet_certs.py`` (the
compose stack's one-shot ``certs`` service) and ``healthcheck.py`` (Docker's HEALTHCHECK and
the Kubernetes probes) against a real gRPC health service over mutual TLS."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from airgossip.common.security.certificates import throwaway_fleet
from airgossip.common.security.tls import TlsCredentials, add_port
from tests.support.cli import ROOT

SCRIPTS = ROOT / "deploy" / "docker"


def script(
    name: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )  # fmt: skip


def test_fleet_certs_issues_every_member_once_and_keeps_the_authority_apart(
    tmp_path: Path,
) -> None:
    authority, certs = tmp_path / "ca", tmp_path / "certs"
    first = script("fleet_certs.py", str(authority), str(certs), "2")
    assert first.returncode == 0, first.stderr
    names = sorted(p.name for p in certs.iterdir())
    assert names == sorted(
        ["ca.pem", "coordinator.pem", "coordinator.key", "agent-0.pem", "agent-0.key",
         "agent-1.pem", "agent-1.key"]
    )  # fmt: skip
    assert sorted(p.name for p in authority.iterdir()) == ["ca.key", "ca.pem"]
    for member in ("coordinator", "agent-0", "agent-1"):
        assert TlsCredentials.load(certs, member).identity == member
    # Again, for a larger fleet: only the new member is issued, nothing else is touched.
    before = {p.name: p.read_bytes() for p in certs.iterdir()}
    again = script("fleet_certs.py", str(authority), str(certs), "3")
    assert again.returncode == 0, again.stderr
    assert "issued agent-2; kept 3 members already there" in again.stdout
    after = {p.name: p.read_bytes() for p in certs.iterdir()}
    assert set(after) - set(before) == {"agent-2.pem", "agent-2.key"}
    assert all(after[name] == data for name, data in before.items())
    assert "issued nothing" in script("fleet_certs.py", str(authority), str(certs), "3").stdout


def test_fleet_certs_refuses_bad_arguments_with_one_line(tmp_path: Path) -> None:
    for args in ((), (str(tmp_path), str(tmp_path / "c"), "0"), ("a", "b", "x")):
        result = script("fleet_certs.py", *args)
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and "usage: fleet_certs.py" in result.stderr


@pytest.fixture
def tls_health(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A gRPC health service serving over mutual TLS as agent-0; its address and the
    fleet's certificates."""
    certs = throwaway_fleet(tmp_path / "certs", ["agent-0", "agent-1"])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = add_port(server, "127.0.0.1:0", TlsCredentials.load(certs, "agent-0"))
    server.start()
    try:
        yield f"127.0.0.1:{port}", certs
    finally:
        server.stop(grace=None)


def test_the_health_check_dials_with_the_member_s_own_certificate(
    tls_health: tuple[str, Path], tmp_path: Path
) -> None:
    address, certs = tls_health
    # The agent's own copy, as the entry point makes it: ca.pem and one pair.
    own = tmp_path / "own"
    own.mkdir()
    for name in ("ca.pem", "agent-0.pem", "agent-0.key"):
        (own / name).write_bytes((certs / name).read_bytes())
    ok = script("healthcheck.py", env={"AIRGOSSIP_HEALTH_ADDRESS": address,
                                       "AIRGOSSIP_HEALTH_CERTS": str(own)})  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "(mutual TLS): SERVING" in ok.stdout
    # A folder of several members needs the one to check as.
    named = script("healthcheck.py", env={"AIRGOSSIP_HEALTH_ADDRESS": address,
                                          "AIRGOSSIP_HEALTH_CERTS": str(certs),
                                          "AIRGOSSIP_HEALTH_IDENTITY": "agent-0"})  # fmt: skip
    assert named.returncode == 0, named.stdout + named.stderr
    unnamed = script("healthcheck.py", env={"AIRGOSSIP_HEALTH_ADDRESS": address,
                                            "AIRGOSSIP_HEALTH_CERTS": str(certs)})  # fmt: skip
    assert unnamed.returncode == 1 and "AIRGOSSIP_HEALTH_IDENTITY" in unnamed.stdout
    # Plaintext against a TLS service is not healthy; nor is another member's name for it.
    plain = script("healthcheck.py", env={"AIRGOSSIP_HEALTH_ADDRESS": address})
    assert plain.returncode == 1 and "UNAVAILABLE" in plain.stdout
    other = script("healthcheck.py", env={"AIRGOSSIP_HEALTH_ADDRESS": address,
                                          "AIRGOSSIP_HEALTH_CERTS": str(certs),
                                          "AIRGOSSIP_HEALTH_IDENTITY": "agent-1"})  # fmt: skip
    assert other.returncode == 1
