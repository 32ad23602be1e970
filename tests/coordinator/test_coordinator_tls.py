"""The coordinator over mutual TLS: each certificate acts only for its own identity.

Real gRPC on loopback with the test CA's certificates: an agent registers, heartbeats,
watches and leaves as itself; the same calls for another agent (to move it to an address of
the attacker's choosing, or to make it leave) are refused and change nothing; a client
without a valid certificate never gets through; every refusal is counted by reason.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import grpc
import pytest

from airgossip.common.security.certificates import load_authority, make_certificate
from airgossip.common.security.tls import COORDINATOR_IDENTITY, TlsCredentials, dial
from airgossip.coordinator.client import CoordinatorClient
from airgossip.coordinator.service import CoordinatorServer, TopologySpec
from airgossip.protos import coordinator_pb2, coordinator_pb2_grpc
from tests.support.tls import credentials, credentials_folder


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    server = CoordinatorServer(
        expected=3, topology=TopologySpec("ring"), security=credentials(COORDINATOR_IDENTITY),
        metrics_listen="127.0.0.1:0",
    )  # fmt: skip
    server.start()
    yield server
    server.stop(grace_s=0)


def stub_as(server: CoordinatorServer, security: TlsCredentials | None) -> grpc.Channel:
    if security is None:
        return grpc.insecure_channel(server.address)
    return dial(server.address, COORDINATOR_IDENTITY, security)


def test_each_certificate_acts_only_for_itself(server: CoordinatorServer) -> None:
    clients = []
    for i in range(3):
        client = CoordinatorClient(server.address, f"agent-{i}", security=credentials(f"agent-{i}"))
        client.register(f"127.0.0.1:{3000 + i}", "d1", timeout_s=10)
        clients.append(client)
    try:
        before = {m.agent_id: (m.address, m.state) for m in server.view().members}
        with stub_as(server, credentials("agent-1")) as channel:
            coordinator = coordinator_pb2_grpc.CoordinatorStub(channel)
            calls = {
                "Register": lambda: coordinator.Register(coordinator_pb2.RegisterRequest(
                    agent_id="agent-2", address="10.66.6.6:7000", fleet_digest="d1"), timeout=5),
                "Leave": lambda: coordinator.Leave(
                    coordinator_pb2.LeaveRequest(agent_id="agent-2"), timeout=5),
                "Heartbeat": lambda: coordinator.Heartbeat(
                    coordinator_pb2.HeartbeatRequest(agent_id="agent-2"), timeout=5),
                "WatchNeighbours": lambda: next(iter(coordinator.WatchNeighbours(
                    coordinator_pb2.WatchRequest(agent_id="agent-2"), timeout=5))),
            }  # fmt: skip
            for name, call in calls.items():
                with pytest.raises(grpc.RpcError) as info:
                    call()
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
                assert "cannot act for 'agent-2'" in (info.value.details() or ""), name
            # its own address it may change
            own = coordinator_pb2.RegisterRequest(
                agent_id="agent-1", address="127.0.0.1:3999", fleet_digest="d1"
            )
            coordinator.Register(own, timeout=5)
        after = {m.agent_id: (m.address, m.state) for m in server.view().members}
        assert after == {**before, "agent-1": ("127.0.0.1:3999", before["agent-1"][1])}
        refusals = server.servicer.refusals.snapshot()
        for name in ("Register", "Leave", "Heartbeat", "WatchNeighbours"):
            assert refusals[(name, "identity_mismatch")] == 1
    finally:
        for client in clients:
            client.close()


def test_clients_without_a_valid_certificate_never_get_through(server: CoordinatorServer) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    authority, key = load_authority(credentials_folder())
    ca_pem = credentials("agent-0").ca_pem
    expired = TlsCredentials("agent-0", ca_pem, *make_certificate(
        authority, key, "agent-0", not_before=now - datetime.timedelta(days=2),
        not_after=now - datetime.timedelta(hours=1),
    ))  # fmt: skip
    for who, security in [("plaintext", None), ("expired", expired)]:
        with stub_as(server, security) as channel:
            with pytest.raises(grpc.RpcError) as info:
                coordinator_pb2_grpc.CoordinatorStub(channel).Register(
                    coordinator_pb2.RegisterRequest(agent_id="agent-0", address="1.2.3.4:5"),
                    timeout=5,
                )
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, who
    assert server.view().members == ()


def test_an_agent_refuses_a_coordinator_with_another_identity() -> None:
    # A server holding agent-2's certificate pretends to be the coordinator.
    impostor = CoordinatorServer(
        expected=1, topology=TopologySpec("ring"), security=credentials("agent-2")
    )
    impostor.start()
    client = CoordinatorClient(impostor.address, "agent-0", security=credentials("agent-0"))
    try:
        from airgossip.coordinator.client import CoordinatorError

        with pytest.raises(CoordinatorError, match="no coordinator at"):
            client.register("127.0.0.1:1", "d1", timeout_s=2)
        assert impostor.view().members == ()
    finally:
        client.close()
        impostor.stop(grace_s=0)


def test_undecodable_requests_are_refused_and_counted(server: CoordinatorServer) -> None:
    with stub_as(server, credentials("agent-0")) as channel:
        for method in ("Register", "Heartbeat", "Leave"):
            raw = channel.unary_unary(f"/airgossip.v1.Coordinator/{method}")
            with pytest.raises(grpc.RpcError) as info:
                raw(b"\xff\xff\xff\xff not protobuf", timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    refusals = server.servicer.refusals.snapshot()
    assert {k: v for k, v in refusals.items() if k[1] == "undecodable"} == {
        ("Register", "undecodable"): 1, ("Heartbeat", "undecodable"): 1,
        ("Leave", "undecodable"): 1,
    }  # fmt: skip
    import urllib.request

    with urllib.request.urlopen(f"http://{server.metrics_address}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    assert (
        'airgossip_coordinator_refusals_total{method="Register",reason="undecodable"} 1.0' in text
    )


def test_an_identity_off_the_roster_is_refused_on_every_call_and_counted(
    server: CoordinatorServer,
) -> None:
    # mallory's certificate is the fleet CA's, but mallory is not one of the run's agents.
    with stub_as(server, credentials("mallory")) as channel:
        coordinator = coordinator_pb2_grpc.CoordinatorStub(channel)
        calls = {
            "Register": lambda: coordinator.Register(coordinator_pb2.RegisterRequest(
                agent_id="mallory", address="10.66.6.6:7000"), timeout=5),
            "Heartbeat": lambda: coordinator.Heartbeat(
                coordinator_pb2.HeartbeatRequest(agent_id="mallory"), timeout=5),
            "Report": lambda: coordinator.Report(
                coordinator_pb2.ReportRequest(agent_id="mallory"), timeout=5),
            "GetRun": lambda: coordinator.GetRun(
                coordinator_pb2.RunRequest(agent_id="mallory"), timeout=5),
            "Leave": lambda: coordinator.Leave(
                coordinator_pb2.LeaveRequest(agent_id="mallory"), timeout=5),
            "WatchNeighbours": lambda: next(iter(coordinator.WatchNeighbours(
                coordinator_pb2.WatchRequest(agent_id="mallory"), timeout=5))),
        }  # fmt: skip
        for name, call in calls.items():
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
            assert info.value.details() == (
                "'mallory' is not a member of this run (roster: agent-0..agent-2); the "
                "coordinator's --roster names the run's agents"
            ), name
    view = server.view()
    assert view.members == () and view.roster == "agent-0..agent-2"
    assert set(view.counters.values()) == {0}  # no registration, nothing else counted
    assert server.status().registered == 0
    refusals = server.servicer.refusals.snapshot()
    assert refusals == {(name, "not_member"): 1 for name in calls}
    import urllib.request

    with urllib.request.urlopen(f"http://{server.metrics_address}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    assert 'airgossip_coordinator_refusals_total{method="Register",reason="not_member"} 1.0' in text
    # The run's agents then register as if nothing had happened.
    clients = [
        CoordinatorClient(server.address, f"agent-{i}", security=credentials(f"agent-{i}"))
        for i in range(3)
    ]
    try:
        for i, client in enumerate(clients):
            client.register(f"127.0.0.1:{3000 + i}", "d1", timeout_s=10)
        assert server.view().released
    finally:
        for client in clients:
            client.close()
