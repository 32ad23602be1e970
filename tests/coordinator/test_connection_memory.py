"""Memory a closed connection used goes back to the kernel (``airgossip.coordinator.malloc``).

A thousand mutual-TLS connections held at once and closed left a real coordinator 83 MB
larger for good (glibc keeps what they freed inside its heap); with the heap trimmer, a
second thousand leaves it within a few MB of where it was.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from airgossip.common.security.tls import COORDINATOR_IDENTITY, dial
from airgossip.coordinator.malloc import TRIM_INTERVAL_S, HeapTrimmer
from tests.support.cli import ROOT
from tests.support.local_fleet import SCENARIO
from tests.support.processes import free_port
from tests.support.tls import credentials, credentials_folder

trimmer = HeapTrimmer()
glibc = pytest.mark.skipif(not trimmer.available, reason="needs glibc 2.33 or later")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_bad_settings_refused() -> None:
    with pytest.raises(ValueError, match="interval_s must be positive"):
        HeapTrimmer(interval_s=0)
    with pytest.raises(ValueError, match="slack_bytes not negative"):
        HeapTrimmer(slack_bytes=-1)


@glibc
def test_trims_once_what_was_freed_inside_the_heap() -> None:
    trimmer = HeapTrimmer(slack_bytes=8 << 20)
    trimmer.check()  # the low point: what is free now
    # 64 MB in blocks of 2 kB (from the heap, not mapped), one in sixteen kept: the heap
    # cannot shrink from its top, what was freed lies between blocks still in use.
    blocks = [bytes(2048) for _ in range(32_768)]
    kept = blocks[::16]
    before = rss_mb(os.getpid())
    del blocks
    assert trimmer.check()
    assert rss_mb(os.getpid()) < before - 32, "the freed pages stayed resident"
    assert not trimmer.check(), "nothing more was freed: no second trim"
    assert trimmer.trims == 1
    del kept


#: The coordinator as ``airgossip coordinator`` runs it, its heap trimmer started first
#: (``airgossip.coordinator.malloc.return_freed_memory``).
COORDINATOR = (
    "from airgossip.coordinator.malloc import return_freed_memory; return_freed_memory(); "
    "from airgossip.cli import app; app(prog_name='airgossip')"
)


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[tuple[int, str]]:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO.format(agents=2))
    port = free_port()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard or hard == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))  # the child inherits it
    with (tmp_path / "coordinator.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", COORDINATOR, "coordinator", "--listen", f"127.0.0.1:{port}",
             "--metrics-port", str(free_port()), "--db", str(tmp_path / "fleet.db"),
             "--out", str(tmp_path / "run"), "--config", str(scenario), "--topology", "ring",
             "--certs", str(credentials_folder())],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    try:
        yield process.pid, f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@glibc
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_memory_of_closed_tls_connections_is_returned(coordinator: tuple[int, str]) -> None:
    pid, address = coordinator
    security = credentials("agent-1")

    def connect(_: int) -> grpc.Channel:
        # A channel of its own (no shared subchannel): a new TCP and TLS connection each.
        channel = dial(
            address, COORDINATOR_IDENTITY, security,
            options=[("grpc.use_local_subchannel_pool", 1)],
        )  # fmt: skip
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=60)
        return channel

    def hold_and_close(count: int) -> float:
        """``count`` connections open at once, then all closed; the RSS at the peak."""
        with ThreadPoolExecutor(16) as pool:
            channels = list(pool.map(connect, range(count)))
        peak = rss_mb(pid)
        for channel in channels:
            channel.close()
        return peak

    deadline = time.monotonic() + 120
    while True:  # until it answers
        try:
            connect(0).close()
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline, "the coordinator never answered"
            time.sleep(0.5)
    settle = 2 * TRIM_INTERVAL_S + 1.0
    hold_and_close(1000)  # warm-up: gRPC's and the server's thread pools reach their size
    time.sleep(settle)
    before = rss_mb(pid)
    peak = hold_and_close(1000)
    time.sleep(settle)
    after = rss_mb(pid)
    print(f"1,000 TLS connections: RSS {before:.1f} MB, {peak:.1f} at the peak, {after:.1f} after")
    assert peak - before > 5, "the connections took no memory: the test measures nothing"
    assert after - before < 10.0, (before, peak, after)
