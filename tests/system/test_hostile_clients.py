"""A hostile client against live agents and a live coordinator, over real gRPC with TLS.

The client holds a valid certificate (a compromised member, ``agent-3``, and a stranger of
the fleet, ``mallory``) and sends, from one seed: random bytes as push chunks, as requests to
every coordinator method and to the health check; well-formed headers with hostile values;
streams that stop half-way; calls to methods that do not exist. Every call must end (with
its status, never a hang), the servers must keep answering health checks, the coordinator's
membership must not move, and afterwards the fleet must still reach the exact average.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from airgossip.common.security.tls import COORDINATOR_IDENTITY, dial
from airgossip.coordinator.client import CoordinatorClient
from airgossip.coordinator.service import CoordinatorServer, TopologySpec
from airgossip.edge.transport import MessageHeader
from airgossip.edge.transport.wire import header_to_proto
from airgossip.protos import gossip_pb2
from tests.support.agents import TlsFleet
from tests.support.tls import credentials

CALLS = 400
COORDINATOR_METHODS = ("Register", "Heartbeat", "Leave", "Report", "GetRun")


def random_bytes(rng: random.Random, most: int = 300) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(rng.randrange(most)))


def hostile_header(rng: random.Random, digest: str, fleet: str) -> bytes:
    pick = rng.choice
    header = MessageHeader(
        sender=pick(["agent-3", "agent-0", "mallory", "", "agent-3" * 50]),
        round=pick([0, 1, 2**63, 2**64 - 1]), seq=pick([0, 1, 2, 2**48, 2**64 - 1]),
        base_seq=pick([0, 1, 2**64 - 1]), algorithm=pick(["push-sum", "dpsgd", "x" * 300]),
        codec=pick(["float64", "qsgd:4", "topk:0.5", "randomk:0.5", "bogus"]),
        numel=pick([8, 0, 7, 2**40, 2**64 - 1]), payload_bytes=pick([0, 64, 32, 1 << 40]),
        scalars=pick([{"y": 0.5}, {"y": -1.0}, {"y": float("inf")}, {}, {"y1": 1e308}]),
        fleet_digest=pick([digest, "", "0" * 16]), codec_meta=random_bytes(rng, 40),
        receiver=pick(["agent-1", "agent-0", ""]), fleet=pick([fleet, "", "other"]),
        epoch=pick([0, 1, 2**64 - 1]),
    )  # fmt: skip
    chunk = gossip_pb2.PushChunk(header=header_to_proto(header), data=random_bytes(rng, 80))
    return chunk.SerializeToString()


@pytest.fixture
def live() -> Iterator[tuple[TlsFleet, CoordinatorServer]]:
    fleet = TlsFleet(4)
    coordinator = CoordinatorServer(
        expected=2, topology=TopologySpec("ring"), security=credentials(COORDINATOR_IDENTITY)
    )
    coordinator.start()
    yield fleet, coordinator
    coordinator.stop(grace_s=0)
    fleet.close()


def test_a_hostile_client_changes_nothing_and_the_fleet_still_converges(
    live: tuple[TlsFleet, CoordinatorServer],
) -> None:
    fleet, coordinator = live
    members = []
    for i in range(2):
        client = CoordinatorClient(
            coordinator.address, f"agent-{i}", security=credentials(f"agent-{i}")
        )
        client.register(f"127.0.0.1:{4000 + i}", "d1", timeout_s=10)
        members.append(client)
    before = {m.agent_id: (m.address, m.state) for m in coordinator.view().members}
    target = fleet["agent-1"]
    rng = random.Random(11)
    outcomes: dict[str, int] = {}
    channels = {
        who: (
            dial(target.address, "agent-1", credentials(who)),
            dial(coordinator.address, COORDINATOR_IDENTITY, credentials(who)),
        )
        for who in ("agent-3", "mallory")
    }
    try:
        for n in range(CALLS):
            gossip, control = channels[rng.choice(sorted(channels))]
            kind = rng.choice(["chunks", "header", "coordinator", "health", "unknown"])
            try:
                if kind in ("chunks", "header"):
                    first = (
                        hostile_header(rng, target.digest, target.fleet)
                        if kind == "header"
                        else random_bytes(rng)
                    )
                    stream = [first, *(random_bytes(rng) for _ in range(rng.randrange(3)))]
                    push = gossip.stream_unary("/airgossip.v1.Gossip/Push")
                    push(iter(stream), timeout=10)
                elif kind == "coordinator":
                    method = COORDINATOR_METHODS[n % len(COORDINATOR_METHODS)]
                    call = control.unary_unary(f"/airgossip.v1.Coordinator/{method}")
                    call(random_bytes(rng), timeout=10)
                elif kind == "health":
                    check = gossip.unary_unary("/grpc.health.v1.Health/Check")
                    check(random_bytes(rng, 40), timeout=10)
                else:
                    gossip.unary_unary("/airgossip.v1.Gossip/Pull")(random_bytes(rng), timeout=10)
                code = "OK"
            except grpc.RpcError as err:
                code = err.code().name
            outcomes[code] = outcomes.get(code, 0) + 1
        assert "DEADLINE_EXCEEDED" not in outcomes, outcomes  # nothing hung
        assert outcomes.get("INVALID_ARGUMENT", 0) > CALLS / 4, outcomes
        for gossip, control in channels.values():
            for channel in (gossip, control):
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
        after = {m.agent_id: (m.address, m.state) for m in coordinator.view().members}
        assert after == before
        fleet.run_to_end()
        assert fleet.relative_error() < 1e-6
    finally:
        for gossip, control in channels.values():
            gossip.close()
            control.close()
        for client in members:
            client.close()
