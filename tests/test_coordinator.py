"""The minimal coordinator over real gRPC: registration, assignments, refusals."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from coordinator.client import CoordinatorClient, CoordinatorError
from coordinator.convert import assignment_from_proto
from coordinator.service import CoordinatorServer, TopologySpec, natural_key
from edge.topology import Assignment
from protos import coordinator_pb2, coordinator_pb2_grpc


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    server = CoordinatorServer(expected=4, topology=TopologySpec("exponential"), token="s3cret")
    server.start()
    yield server
    server.stop(grace_s=0)


def register(server: CoordinatorServer, agent_id: str, **kw: str) -> None:
    fields = {"agent_id": agent_id, "address": f"127.0.0.1:{1000 + len(agent_id)}",
              "token": "s3cret", "fleet_digest": "d1", **kw}  # fmt: skip
    with grpc.insecure_channel(server.address) as channel:
        coordinator_pb2_grpc.CoordinatorStub(channel).Register(
            coordinator_pb2.RegisterRequest(**fields), timeout=5
        )


def test_fleet_is_released_when_complete(server: CoordinatorServer) -> None:
    received: dict[str, Assignment] = {}
    clients = []
    for i in range(4):
        client = CoordinatorClient(server.address, f"agent-{i}", token="s3cret")
        client.register(f"127.0.0.1:{2000 + i}", "d1")
        client.follow(lambda a, i=i: received.__setitem__(f"agent-{i}", a))
        clients.append(client)
    try:
        assert clients[0].wait_ready(lambda: len(received) == 4, 10)
        a0 = received["agent-0"]
        assert set(a0.phase(0).out_weights) == {"agent-1", "agent-2"}
        assert a0.peers["agent-1"] == "127.0.0.1:2001"
        assert a0.lambda2 == pytest.approx(1 / 3)
        assert {a.epoch for a in received.values()} == {1}
    finally:
        for client in clients:
            client.close()


def test_refusals(server: CoordinatorServer) -> None:
    with pytest.raises(grpc.RpcError) as info:
        register(server, "agent-0", token="wrong")
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    register(server, "agent-0")
    with pytest.raises(grpc.RpcError) as info:
        register(server, "agent-1", fleet_digest="other")
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "different task or initial parameters" in (info.value.details() or "")
    for i in range(1, 4):
        register(server, f"agent-{i}")
    with pytest.raises(grpc.RpcError) as info:
        register(server, "agent-9")
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    register(server, "agent-2")  # re-registering a known id is fine
    with grpc.insecure_channel(server.address) as channel:
        stream = coordinator_pb2_grpc.CoordinatorStub(channel).WatchNeighbours(
            coordinator_pb2.WatchRequest(agent_id="ghost", token="s3cret"), timeout=5
        )
        with pytest.raises(grpc.RpcError) as info:
            next(iter(stream))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_client_reports_refusal_plainly(server: CoordinatorServer) -> None:
    client = CoordinatorClient(server.address, "agent-0", token="nope")
    with pytest.raises(CoordinatorError, match="UNAUTHENTICATED"):
        client.register("127.0.0.1:1", "d1", timeout_s=5)
    client.close()


def test_unreachable_coordinator_times_out_with_a_message() -> None:
    client = CoordinatorClient("127.0.0.1:1", "agent-0")
    with pytest.raises(CoordinatorError, match=r"no coordinator at 127\.0\.0\.1:1 "):
        client.register("127.0.0.1:2", "d1", timeout_s=1)
    client.close()


def test_assignment_proto_validation() -> None:
    with pytest.raises(ValueError, match="no phases"):
        assignment_from_proto(coordinator_pb2.Assignment(epoch=1, ready=True))
    bad = coordinator_pb2.Assignment(
        epoch=1, ready=True,
        schedule=[coordinator_pb2.Phase(self_weight=0.9, out_edges=[
            coordinator_pb2.OutEdge(peer_id="x", weight=0.5)])],
    )  # fmt: skip
    with pytest.raises(ValueError, match="sum to 1"):
        assignment_from_proto(bad)


def test_natural_order() -> None:
    assert sorted(["agent-10", "agent-2", "agent-1"], key=natural_key) == [
        "agent-1", "agent-2", "agent-10",
    ]  # fmt: skip
