"""A coordinator that does not run for longer than its heartbeat timeout (its process stopped:
a suspended host, a starved one) does not declare its whole fleet dead when it runs again: the
heartbeats sent meanwhile waited in its queues, and the time it was away is not the agents'
silence. A real coordinator process, stopped with SIGSTOP, and agents heartbeating over gRPC."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from airgossip.protos import coordinator_pb2, coordinator_pb2_grpc
from tests.support.cli import ROOT
from tests.support.processes import free_port

AGENTS = ("agent-0", "agent-1")
INTERVAL_S, TIMEOUT_S = 0.5, 2.0
STOPPED_S = 5.0  # over twice the timeout


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in the coordinator's /metrics")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_coordinator_stopped_past_its_timeout_declares_no_one_dead(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    log_path = tmp_path / "coordinator.log"
    with log_path.open("wb") as log:
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "airgossip", "coordinator", "--listen", f"127.0.0.1:{port}",
             "--metrics-port", str(metrics_port), "--agents", str(len(AGENTS)), "--insecure",
             "--heartbeat-interval-s", str(INTERVAL_S), "--heartbeat-timeout-s", str(TIMEOUT_S),
             "--out", str(tmp_path / "run")],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    stop = threading.Event()
    answers: dict[str, list[str]] = {agent: [] for agent in AGENTS}

    def heartbeats(agent: str) -> None:
        while not stop.wait(INTERVAL_S):
            try:
                request = coordinator_pb2.HeartbeatRequest(agent_id=agent)
                stub.Heartbeat(request, timeout=30)
                answers[agent].append("OK")
            except grpc.RpcError as err:
                answers[agent].append(err.code().name)

    threads = [threading.Thread(target=heartbeats, args=(a,), daemon=True) for a in AGENTS]
    try:
        grpc.channel_ready_future(channel).result(timeout=60)
        for i, agent in enumerate(AGENTS):
            stub.Register(
                coordinator_pb2.RegisterRequest(
                    agent_id=agent, address=f"127.0.0.1:{port + 1 + i}", fleet_digest="d1"
                ),
                timeout=10,
            )
        for thread in threads:
            thread.start()
        time.sleep(3 * INTERVAL_S)
        os.kill(coordinator.pid, signal.SIGSTOP)
        time.sleep(STOPPED_S)
        os.kill(coordinator.pid, signal.SIGCONT)
        time.sleep(TIMEOUT_S + 1.0)  # long enough for a declaration to have been made
        stop.set()
        for thread in threads:
            thread.join(35)
        log = log_path.read_text()
        assert "declared dead" not in log, log[-3000:]
        assert metric(metrics_port, "airgossip_coordinator_agent_failures_total") == 0
        stalled = metric(metrics_port, "airgossip_coordinator_stalled_seconds_total")
        # At least the stop less the sweep's longest wait (1 s, when the stop came just after
        # a sweep) and its slack; a loaded machine may add its own lateness.
        assert STOPPED_S - 1.5 < stalled < 3 * STOPPED_S, stalled
        assert "the coordinator did not run for" in log, log[-3000:]
        for agent, codes in answers.items():
            # Every heartbeat answered, the ones sent while it was stopped late: none was
            # refused as coming from an agent the coordinator had declared dead.
            assert codes and set(codes) == {"OK"}, (agent, codes)
    finally:
        stop.set()
        channel.close()
        if coordinator.poll() is None:
            os.kill(coordinator.pid, signal.SIGCONT)
            coordinator.terminate()
            coordinator.wait(10)
