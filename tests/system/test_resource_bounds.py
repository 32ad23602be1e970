"""Resources an adversary cannot exhaust, over real gRPC with mutual TLS (slow: each claim
needs its full duration or count to mean anything).

* 70 idle push streams held open for 30 s (re-opened as soon as the agent ends them), from a
  compromised in-neighbour's certificate and from a stranger's, plus TCP connections that
  never finish a handshake: genuine pushes and health checks are still answered throughout.
* 10,000 undecodable requests: neither an agent's nor the coordinator's resident memory
  grows by more than 10 MB, and their thread counts stay flat.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from airgossip.common.security.tls import COORDINATOR_IDENTITY, dial
from tests.support.agents import TlsFleet
from tests.support.local_fleet import LocalFleet
from tests.support.tls import credentials

pytestmark = pytest.mark.slow

IDLE_STREAMS = 70
HOLD_S = 30.0


class IdleStreams:
    """Keeps ``count`` push streams open to ``address``, each sending nothing, re-opening one
    as soon as the agent ends it; counts how each ended."""

    def __init__(self, address: str, target: str, identities: list[str], count: int) -> None:
        self.stop = threading.Event()
        self.ended: dict[str, int] = {}
        self._lock = threading.Lock()
        self._channels = [dial(address, target, credentials(i)) for i in identities]
        self._threads = [
            threading.Thread(target=self._hold, args=(self._channels[k % len(identities)],),
                             daemon=True)
            for k in range(count)
        ]  # fmt: skip

    def _hold(self, channel: grpc.Channel) -> None:
        push = channel.stream_unary("/airgossip.v1.Gossip/Push")
        while not self.stop.is_set():
            released = threading.Event()

            def nothing(released: threading.Event = released) -> Iterator[bytes]:
                released.wait()  # never sends a chunk
                return
                yield b""

            call = push.future(nothing(), timeout=HOLD_S * 3)
            try:
                call.result()
                code = "OK"
            except grpc.RpcError as err:
                code = err.code().name
            except grpc.FutureCancelledError:
                code = "CANCELLED"
            finally:
                released.set()
            with self._lock:
                self.ended[code] = self.ended.get(code, 0) + 1
            self.stop.wait(0.05)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=HOLD_S)
        for channel in self._channels:
            channel.close()


@pytest.fixture
def fleet() -> Iterator[TlsFleet]:
    fleet = TlsFleet(4, rounds=10**7)
    yield fleet
    for agent in fleet.agents:
        agent.stop()
    fleet.close()


@pytest.mark.timeout(300)
def test_idle_streams_leave_genuine_pushes_and_health_checks_answered(fleet: TlsFleet) -> None:
    target = fleet["agent-1"]  # in-neighbours agent-0 (genuine) and agent-3 (compromised)
    fleet.start_running()
    time.sleep(1.0)
    host, port = target.address.rsplit(":", 1)
    half_open = [socket.create_connection((host, int(port))) for _ in range(20)]  # no handshake
    attack = IdleStreams(target.address, "agent-1", ["agent-3", "mallory"], IDLE_STREAMS)
    attack.start()
    latencies, received = [], []
    try:
        with dial(target.address, "agent-1", credentials("agent-0")) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            started = time.monotonic()
            while time.monotonic() - started < HOLD_S:
                began = time.monotonic()
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                latencies.append(time.monotonic() - began)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
                received.append(target.counters().messages_received)
                assert target.transport.slots.in_use() <= target.transport.slots.limit  # type: ignore[attr-defined]
                time.sleep(1.0)
    finally:
        attack.close()
        for sock in half_open:
            sock.close()
    # genuine pushes (agent-0's) kept arriving in every 5-second window of the attack
    windows = [received[k + 5] - received[k] for k in range(0, len(received) - 5, 5)]
    print(f"health check latency max {max(latencies) * 1000:.0f} ms; pushes absorbed per 5 s: "
          f"{windows}; idle streams ended by: {attack.ended}")  # fmt: skip
    assert max(latencies) < 2.0
    assert all(w > 0 for w in windows), windows
    assert attack.ended.get("DEADLINE_EXCEEDED", 0) > 0  # the agent ended stalled streams
    assert attack.ended.get("PERMISSION_DENIED", 0) > 0  # and refused the stranger at once
    time.sleep(3.0)  # what agent-3 could not deliver meanwhile arrives with its next sums
    for agent in fleet.agents:
        agent.stop()
    fleet.join()
    assert fleet.relative_error() < 1e-6


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no thread count for {pid}")


#: Rounds slowed by latency, so that what the test measures is the garbage, not a fleet
#: racing through rounds (the coordinator keeps round reports in its database, whose page
#: cache still fills up to its bound as the run grows).
CONSENSUS = """\
agents = 2
rounds = 10000000
wait_timeout_s = 0.25
[task]
name = "consensus"
dim = 8
[network]
loss = 0.0
latency_ms = 500
"""
GARBAGE = b"\\xff\\xff\\xff\\xff\\x0f garbage, not a protobuf message " * 4


@pytest.mark.timeout(600)
def test_undecodable_requests_keep_no_memory(tmp_path: Path) -> None:
    fleet = LocalFleet(tmp_path, agents=2, topology=["--topology", "ring"], scenario=CONSENSUS)
    try:
        fleet.start_coordinator()
        for i in range(2):
            fleet.start_agent(i)
        fleet.wait(lambda: all(fleet.round_of(i) >= 5 for i in range(2)), 120, "both to run")
        agent = fleet.agents[0]
        assert fleet.coordinator is not None
        agent_address = fleet.members()["agent-0"]["address"]
        gossip = dial(agent_address, "agent-0", credentials("agent-1"))
        control = dial(f"127.0.0.1:{fleet.grpc_port}", COORDINATOR_IDENTITY, credentials("agent-1"))
        push = gossip.stream_unary("/airgossip.v1.Gossip/Push")
        register = control.unary_unary("/airgossip.v1.Coordinator/Register")
        heartbeat = control.unary_unary("/airgossip.v1.Coordinator/Heartbeat")
        codes: dict[str, int] = {}
        lock = threading.Lock()

        def call(n: int) -> None:
            code = "RESOURCE_EXHAUSTED"
            while code == "RESOURCE_EXHAUSTED":  # agent-1's genuine push held its edge: again
                try:
                    if n % 2 == 0:
                        push(iter([GARBAGE]), timeout=10)  # an undecodable first chunk
                    else:
                        (register if n % 4 == 1 else heartbeat)(GARBAGE, timeout=10)
                    code = "OK"
                except grpc.RpcError as err:
                    code = err.code().name
                with lock:
                    codes[code] = codes.get(code, 0) + 1

        def burst(count: int) -> None:
            # Pushes one at a time (the agent takes one stream per edge, and agent-1 is
            # the only in-neighbour), coordinator calls eight at a time beside them.
            with ThreadPoolExecutor(8) as pool:
                coordinator_calls = pool.map(call, range(1, 2 * count, 2))
                for n in range(0, 2 * count, 2):
                    call(n)
                list(coordinator_calls)

        pids = {"agent": agent.pid, "coordinator": fleet.coordinator.pid}
        burst(1000)  # warm-up: pools, channels, caches reach their working size
        time.sleep(1.0)
        codes.clear()
        before = {k: (rss_mb(p), threads(p)) for k, p in pids.items()}
        started = time.monotonic()
        burst(10_000)  # 10,000 undecodable pushes to the agent, 10,000 calls to the coordinator
        elapsed = time.monotonic() - started
        time.sleep(2.0)
        after = {k: (rss_mb(p), threads(p)) for k, p in pids.items()}
        gossip.close()
        control.close()
        print(f"20,000 undecodable requests in {elapsed:.1f} s; codes {codes}; "
              f"RSS MB and threads before {before}, after {after}")  # fmt: skip
        assert codes["INVALID_ARGUMENT"] == 20_000 and set(codes) <= {
            "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"
        }, codes  # fmt: skip
        for name in pids:
            assert after[name][0] - before[name][0] < 10.0, (name, before, after)
            # server pools grow to the client's concurrency (8) at most, not per request
            assert after[name][1] <= before[name][1] + 8, (name, before, after)
        assert all(fleet.agents[i].poll() is None for i in range(2))
        rounds = fleet.round_of(0)
        fleet.wait(lambda: fleet.round_of(0) > rounds + 5, 60, "agent-0 to keep gossiping")
    finally:
        fleet.close()
