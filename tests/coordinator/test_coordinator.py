"""The minimal coordinator over real gRPC: registration, assignments, refusals."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from airgossip.common.identity import natural_key
from airgossip.common.topology import Assignment
from airgossip.coordinator.client import CoordinatorClient, CoordinatorError
from airgossip.coordinator.convert import assignment_from_proto
from airgossip.coordinator.membership import LivenessSettings
from airgossip.coordinator.roster import Roster
from airgossip.coordinator.service import CoordinatorServer, TopologySpec
from airgossip.coordinator.views import MemberView
from airgossip.edge.observability.telemetry import AgentSnapshot
from airgossip.protos import coordinator_pb2, coordinator_pb2_grpc


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
        register(server, "agent-9")  # not one of the run's 4
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert info.value.details() == (
        "'agent-9' is not a member of this run (roster: agent-0..agent-3); the coordinator's "
        "--roster names the run's agents"
    )
    register(server, "agent-2")  # re-registering a known id is fine
    with grpc.insecure_channel(server.address) as channel:
        stream = coordinator_pb2_grpc.CoordinatorStub(channel).WatchNeighbours(
            coordinator_pb2.WatchRequest(agent_id="ghost", token="s3cret"), timeout=5
        )
        with pytest.raises(grpc.RpcError) as info:
            next(iter(stream))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "agent-9" not in {m.agent_id for m in server.view().members}


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


def stub(server: CoordinatorServer) -> tuple[grpc.Channel, coordinator_pb2_grpc.CoordinatorStub]:
    channel = grpc.insecure_channel(server.address)
    return channel, coordinator_pb2_grpc.CoordinatorStub(channel)


def test_register_with_a_wrong_token_is_unauthenticated(server: CoordinatorServer) -> None:
    channel, coordinator = stub(server)
    with channel:
        calls = [
            lambda: coordinator.Register(
                coordinator_pb2.RegisterRequest(
                    agent_id="agent-0", address="127.0.0.1:1", token="wrong", fleet_digest="d1"
                ),
                timeout=5,
            ),
            lambda: coordinator.Heartbeat(
                coordinator_pb2.HeartbeatRequest(agent_id="agent-0", token=""), timeout=5
            ),
            lambda: coordinator.Leave(
                coordinator_pb2.LeaveRequest(agent_id="agent-0", token="s3cre"), timeout=5
            ),
            lambda: next(
                iter(
                    coordinator.WatchNeighbours(
                        coordinator_pb2.WatchRequest(agent_id="agent-0", token="x"), timeout=5
                    )
                )
            ),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert info.value.details() == "wrong or missing join token"
    assert server.view().members == ()


def test_heartbeats_carry_stats_and_bad_ones_are_refused(server: CoordinatorServer) -> None:
    channel, coordinator = stub(server)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            coordinator.Heartbeat(
                coordinator_pb2.HeartbeatRequest(agent_id="agent-0", token="s3cret"), timeout=5
            )
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        register(server, "agent-0")
        stats = coordinator_pb2.AgentStats(
            round=9, accuracy=0.75, links=[coordinator_pb2.LinkStats(peer_id="agent-0")]
        )
        reply = coordinator.Heartbeat(
            coordinator_pb2.HeartbeatRequest(agent_id="agent-0", token="s3cret", stats=stats),
            timeout=5,
        )
        assert reply.epoch == 0
        member = members(server)["agent-0"]
        assert member.stats is not None and member.stats.round == 9
        assert member.stats.accuracy == 0.75 and member.stats.loss is None
        bad = [
            coordinator_pb2.HeartbeatRequest(
                agent_id="agent-0", token="s3cret",
                stats=coordinator_pb2.AgentStats(accuracy=float("nan")),
            ),
            coordinator_pb2.HeartbeatRequest(
                agent_id="agent-0", token="s3cret",
                stats=coordinator_pb2.AgentStats(
                    links=[coordinator_pb2.LinkStats(peer_id="a")] * 2
                ),
            ),
            coordinator_pb2.HeartbeatRequest(agent_id="../etc", token="s3cret"),
        ]  # fmt: skip
        for request in bad:
            with pytest.raises(grpc.RpcError) as info:
                coordinator.Heartbeat(request, timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
        after = members(server)["agent-0"].stats
        assert after is not None and after.accuracy == 0.75  # untouched by the refused ones


def follow_all(address: str, n: int, **kw: object) -> tuple[list[CoordinatorClient], dict]:
    received: dict[str, Assignment] = {}
    clients = []
    for i in range(n):
        client = CoordinatorClient(address, f"agent-{i}", token="s3cret")
        client.register(f"127.0.0.1:{2000 + i}", "d1", **kw)  # type: ignore[arg-type]
        client.follow(lambda a, i=i: received.__setitem__(f"agent-{i}", a))
        client.start_heartbeats(lambda i=i: AgentSnapshot(round=i))
        clients.append(client)
    return clients, received


def members(server: CoordinatorServer) -> dict[str, MemberView]:
    return {m.agent_id: m for m in server.view().members}


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_agents_ride_out_a_coordinator_restart_on_the_same_db(tmp_path: Path) -> None:
    liveness = LivenessSettings(heartbeat_interval_s=0.2, heartbeat_timeout_s=3.0)
    kw = dict(expected=3, topology=TopologySpec("k-out", seed=1), token="s3cret",
              db=tmp_path / "fleet.db", liveness=liveness)  # fmt: skip
    first = CoordinatorServer(**kw)  # type: ignore[arg-type]
    first.start()
    clients, received = follow_all(first.address, 3)
    try:
        assert wait_for(lambda: len(received) == 3)
        assert wait_for(lambda: first.view().counters["heartbeats"] >= 6)
        before = {i: a for i, a in received.items()}
        joined = {i: m.joined_at for i, m in members(first).items()}
        edges = first.view().edges
        first.stop(grace_s=0)
        time.sleep(1.0)  # the agents notice and keep their neighbours
        assert received == before
        second = CoordinatorServer(listen=first.address, **kw)  # type: ignore[arg-type]
        assert second.restored
        assert {i: m.joined_at for i, m in members(second).items()} == joined
        assert second.view().edges == edges and second.view().epoch == 1
        second.start()
        try:
            assert wait_for(lambda: second.view().counters["heartbeats"] >= 6)
            # The agents registered again on their own; nothing changed, nobody was evicted.
            assert wait_for(lambda: second.view().counters["registrations"] == 3)
            view = second.view()
            assert view.epoch == 1 and view.counters["failures"] == 0
            assert received == before
        finally:
            second.stop(grace_s=0)
    finally:
        for client in clients:
            client.close()


def test_agents_register_again_with_a_coordinator_that_forgot_them() -> None:
    liveness = LivenessSettings(heartbeat_interval_s=0.2, heartbeat_timeout_s=3.0)
    first = CoordinatorServer(expected=2, topology=TopologySpec("ring"), token="s3cret",
                              liveness=liveness)  # fmt: skip
    first.start()
    clients, received = follow_all(first.address, 2)
    try:
        assert wait_for(lambda: len(received) == 2)
        first.stop(grace_s=0)
        received.clear()
        amnesiac = CoordinatorServer(expected=2, topology=TopologySpec("ring"), token="s3cret",
                                     listen=first.address, liveness=liveness)  # fmt: skip
        amnesiac.start()
        try:
            assert wait_for(lambda: amnesiac.view().released and len(received) == 2)
            assert set(members(amnesiac)) == {"agent-0", "agent-1"}
        finally:
            amnesiac.stop(grace_s=0)
    finally:
        for client in clients:
            client.close()


def test_silent_agent_is_declared_dead_on_time_and_rejoins() -> None:
    liveness = LivenessSettings(heartbeat_interval_s=0.2, heartbeat_timeout_s=1.5)
    # agent-9 is on the roster: a static fleet that is full refuses it all the same.
    server = CoordinatorServer(expected=3, topology=TopologySpec("exponential"), token="s3cret",
                               liveness=liveness, roster=Roster.parse("0..9"))  # fmt: skip
    server.start()
    clients, received = follow_all(server.address, 3)
    mute = CoordinatorClient(server.address, "agent-2", token="s3cret")
    try:
        assert wait_for(lambda: len(received) == 3)
        silenced = time.time()
        clients[2].close()  # its process froze: no heartbeat, no goodbye
        assert wait_for(lambda: members(server)["agent-2"].state == "dead", timeout=10)
        lag = members(server)["agent-2"].changed_at - silenced
        assert 0.5 * 1.5 <= lag <= 1.5 + 1.0, lag
        assert wait_for(lambda: received["agent-0"].epoch == 2)
        assert set(received["agent-0"].peers) == {"agent-1"}
        with pytest.raises(CoordinatorError, match="RESOURCE_EXHAUSTED"):
            stranger = CoordinatorClient(server.address, "agent-9", token="s3cret")
            try:
                stranger.register("127.0.0.1:2998", "d1", timeout_s=5)
            finally:
                stranger.close()
        # agent-2 comes back but never sends a heartbeat: evicted again, its stream ends with
        # NOT_FOUND, and its client registers again by itself.
        mute.register("127.0.0.1:2999", "d1")
        mute.follow(lambda a: None)
        assert wait_for(lambda: received["agent-0"].epoch >= 3)
        assert "agent-2" in received["agent-0"].peers
        assert wait_for(lambda: members(server)["agent-2"].incarnation >= 3, 15)
        assert wait_for(lambda: mute.registrations >= 2, 5)  # its reply lands just after
    finally:
        mute.close()
        for client in clients[:2]:
            client.close()
        server.stop(grace_s=0)
