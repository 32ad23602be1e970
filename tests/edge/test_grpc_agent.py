"""Real gRPC on loopback: hostile or corrupt messages are refused and change nothing."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from airgossip.edge.agent import Agent
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.transport import GossipMessage, MessageHeader
from airgossip.edge.transport.grpc_transport import GrpcTransport, PortInUseError
from airgossip.edge.transport.wire import header_to_proto
from airgossip.protos import gossip_pb2, gossip_pb2_grpc
from tests.support.agents import (
    agent_channel,
    assert_pair_reaches_average,
    grpc_pair,
    push,
    refused,
)

SETTINGS = AgentSettings(
    task=TaskSettings(name="consensus", dim=8), rounds=30, wait_timeout_s=0.5, seed=5
)


@pytest.fixture
def pair() -> Iterator[tuple[Agent, Agent]]:
    yield from grpc_pair(SETTINGS)


def header(agent: Agent, **overrides: object) -> MessageHeader:
    fields: dict[str, object] = dict(
        sender="agent-1", round=1, seq=1, base_seq=0, algorithm="push-sum", codec="float64",
        numel=8, payload_bytes=64, scalars={"y": 0.5}, fleet_digest=agent.digest,
        receiver=agent.agent_id, fleet=agent.fleet,
    )  # fmt: skip
    fields.update(overrides)
    return MessageHeader(**fields)  # type: ignore[arg-type]


def snapshot(agent: Agent) -> tuple[torch.Tensor, torch.Tensor, float]:
    x, y = agent.algorithm.mass()  # type: ignore[attr-defined]
    return agent.algorithm.estimate().clone(), x.clone(), y


def values(*items: float) -> bytes:
    return torch.tensor(items, dtype=torch.float64).numpy().tobytes()


def test_hostile_messages_are_refused_with_status_and_reason(pair: tuple[Agent, Agent]) -> None:
    receiver, _ = pair
    before = snapshot(receiver)
    good = values(*range(8))
    cases = [
        (GossipMessage(header(receiver, numel=7, payload_bytes=56), good[:56]),
         grpc.StatusCode.INVALID_ARGUMENT, "wrong shape: 7 elements, this model has 8"),
        (GossipMessage(header(receiver), values(1, 2, float("nan"), 4, 5, 6, 7, 8)),
         grpc.StatusCode.INVALID_ARGUMENT, "NaN or infinite"),
        (GossipMessage(header(receiver), values(1, 2, float("inf"), 4, 5, 6, 7, 8)),
         grpc.StatusCode.INVALID_ARGUMENT, "NaN or infinite"),
        (GossipMessage(header(receiver, sender="mallory"), good),
         grpc.StatusCode.PERMISSION_DENIED, "'mallory' is not an in-neighbour of agent-0"),
        (GossipMessage(header(receiver, fleet_digest="0" * 16), good),
         grpc.StatusCode.FAILED_PRECONDITION, "initial parameters differ"),
        (GossipMessage(header(receiver, algorithm="dpsgd"), good),
         grpc.StatusCode.FAILED_PRECONDITION, "algorithm 'dpsgd'"),
        (GossipMessage(header(receiver, codec="zstd"), good),
         grpc.StatusCode.INVALID_ARGUMENT, "unknown codec 'zstd'"),
        (GossipMessage(header(receiver, payload_bytes=80), good + bytes(16)),
         grpc.StatusCode.INVALID_ARGUMENT, "exceeds the float64 size"),
        (GossipMessage(header(receiver, payload_bytes=48), good[:48]),
         grpc.StatusCode.INVALID_ARGUMENT, "48 payload bytes for 8 elements"),
        (GossipMessage(header(receiver, payload_bytes=64), good[:40]),
         grpc.StatusCode.INVALID_ARGUMENT, "stream ended after 40 of the 64"),
        (GossipMessage(header(receiver, payload_bytes=32), good),
         grpc.StatusCode.INVALID_ARGUMENT, "more than the 32 payload bytes"),
        (GossipMessage(header(receiver, scalars={}), good),
         grpc.StatusCode.INVALID_ARGUMENT, "weight 'y'"),
        (GossipMessage(header(receiver, scalars={"y": float("nan")}), good),
         grpc.StatusCode.INVALID_ARGUMENT, "not finite"),
        (GossipMessage(header(receiver, seq=1, base_seq=4), good),
         grpc.StatusCode.INVALID_ARGUMENT, "sequence numbers out of order"),
    ]  # fmt: skip
    for message, code, reason in cases:
        err = refused(receiver, message)
        assert err.code() == code, (reason, err.details())
        assert reason in (err.details() or ""), err.details()
    after = snapshot(receiver)
    for a, b in zip(before, after, strict=True):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    assert receiver.counters().messages_rejected == len(cases)
    assert receiver.counters().messages_received == 0
    # A message it cannot place (measured from a point it never held) is not refused: the
    # answer asks the sender to start the edge over, and nothing changes.
    ack = push(receiver, GossipMessage(header(receiver, seq=3, base_seq=2), good))
    assert ack.start_over and not ack.absorbed and ack.last_seq == 0
    for a, b in zip(before, snapshot(receiver), strict=True):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    assert receiver.counters().messages_received == 0
    # ... and the agent still takes a good message
    ack = push(receiver, GossipMessage(header(receiver), good))
    assert ack.absorbed and ack.last_seq == 1


def test_malformed_streams_are_refused(pair: tuple[Agent, Agent]) -> None:
    receiver, _ = pair
    with agent_channel(receiver, "agent-1") as channel:
        stub = gossip_pb2_grpc.GossipStub(channel)
        no_header = iter([gossip_pb2.PushChunk(data=b"1234")])
        with pytest.raises(grpc.RpcError) as info:
            stub.Push(no_header, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "must carry the header" in (info.value.details() or "")
        two_headers = iter([
            gossip_pb2.PushChunk(header=header_to_proto(header(receiver)), data=bytes(32)),
            gossip_pb2.PushChunk(header=header_to_proto(header(receiver)), data=bytes(32)),
        ])  # fmt: skip
        with pytest.raises(grpc.RpcError) as info:
            stub.Push(two_headers, timeout=5)
        assert "only the first chunk" in (info.value.details() or "")
        empty = iter([])
        with pytest.raises(grpc.RpcError) as info:
            stub.Push(empty, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        raw = channel.stream_unary("/airgossip.v1.Gossip/Push")
        with pytest.raises(grpc.RpcError) as info:
            raw(iter([b"\xff\xff\xff garbage"]), timeout=5)
        assert info.value.code() != grpc.StatusCode.OK
    assert receiver.counters().messages_received == 0
    with agent_channel(receiver, "agent-1") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="airgossip.v1.Gossip"), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_two_agents_reach_consensus_over_grpc(pair: tuple[Agent, Agent]) -> None:
    assert_pair_reaches_average(pair, timeout_s=60)


def test_busy_port_is_a_clear_error(pair: tuple[Agent, Agent]) -> None:
    taken = pair[0].address
    with pytest.raises(PortInUseError, match=f"cannot listen on {taken}"):
        GrpcTransport("x", listen=taken).start(pair[0])
