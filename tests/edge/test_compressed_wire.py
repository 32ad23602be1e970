"""Real gRPC: compressed, multi-block messages cross, malformed ones are refused unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import torch

from airgossip.edge.agent import Agent
from airgossip.edge.compression import get_codec, join_blocks
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.transport import GossipMessage, MessageHeader
from airgossip.protos import gossip_pb2
from tests.support.agents import assert_pair_reaches_average, grpc_pair, push, refused

SETTINGS = AgentSettings(
    task=TaskSettings(name="consensus", dim=8), rounds=40, wait_timeout_s=0.5, seed=5,
    algorithm="quantized-push-sum", compression="qsgd:4",
)  # fmt: skip


@pytest.fixture
def pair() -> Iterator[tuple[Agent, Agent]]:
    yield from grpc_pair(SETTINGS)


def qsgd(values: list[float], spec: str = "qsgd:4") -> bytes:
    return bytes(get_codec(spec).encode(torch.tensor(values, dtype=torch.float64), seed=1).data)


def header(agent: Agent, **overrides: object) -> MessageHeader:
    fields: dict[str, object] = dict(
        sender="agent-1", round=1, seq=1, base_seq=0, algorithm="quantized-push-sum",
        codec="qsgd:4", numel=8, payload_bytes=8, scalars={"y1": 0.25, "restart": 1.0},
        fleet_digest=agent.digest, receiver=agent.agent_id, fleet=agent.fleet,
    )  # fmt: skip
    fields.update(overrides)
    return MessageHeader(**fields)  # type: ignore[arg-type]


def state(agent: Agent) -> tuple[torch.Tensor, float, int]:
    x, y = agent.algorithm.mass()  # type: ignore[attr-defined]
    return x.clone(), y, len(agent.algorithm._in)  # type: ignore[attr-defined]


def test_malformed_compressed_messages_are_refused_and_change_nothing(
    pair: tuple[Agent, Agent],
) -> None:
    receiver, _ = pair
    before = state(receiver)
    good = qsgd([1, 2, 3, 4, 5, 6, 7, 8])
    nan_scale = np.float32(np.nan).tobytes() + good[4:]
    # topk:0.5 keeps 4 of 8 elements: 16 bytes of indices, then 16 of values
    unsorted = np.array([3, 1, 2, 5], "<i4").tobytes() + np.ones(4, "<f4").tobytes()
    cases = [
        (GossipMessage(header(receiver), nan_scale), grpc.StatusCode.INVALID_ARGUMENT,
         "scale is negative or not finite"),
        (GossipMessage(header(receiver, numel=12, payload_bytes=8), good),
         grpc.StatusCode.INVALID_ARGUMENT, "12 elements, expected 1 to 16 blocks of 8"),
        (GossipMessage(header(receiver, numel=8 * 17, payload_bytes=8), good),
         grpc.StatusCode.INVALID_ARGUMENT, "wrong shape: 136 elements"),
        (GossipMessage(header(receiver, payload_bytes=9), good + b"\0"),
         grpc.StatusCode.INVALID_ARGUMENT, "exceeds the qsgd:4 size for 8 elements (8)"),
        (GossipMessage(header(receiver, payload_bytes=7), good[:7]),
         grpc.StatusCode.INVALID_ARGUMENT, "7 payload bytes for 8 elements, expected 8"),
        (GossipMessage(header(receiver, numel=16, payload_bytes=15), good + good[:7]),
         grpc.StatusCode.INVALID_ARGUMENT, "for 2 blocks of 8 elements"),
        (GossipMessage(header(receiver, scalars={"restart": 1.0}), good),
         grpc.StatusCode.INVALID_ARGUMENT, "weight 'y1'"),
        (GossipMessage(header(receiver, scalars={"y1": -1.0}), good),
         grpc.StatusCode.INVALID_ARGUMENT, "non-negative weight 'y1'"),
        (GossipMessage(header(receiver, seq=2), good), grpc.StatusCode.INVALID_ARGUMENT,
         "holds 8 elements for blocks 1..2"),
        (GossipMessage(header(receiver, codec="topk:0.5", payload_bytes=32), unsorted),
         grpc.StatusCode.INVALID_ARGUMENT, "strictly increasing"),
        (GossipMessage(header(receiver, codec="randomk:0.5", payload_bytes=16), bytes(16)),
         grpc.StatusCode.INVALID_ARGUMENT, "0 bytes of codec metadata"),
        (GossipMessage(header(receiver, codec="qsgd:9"), good), grpc.StatusCode.INVALID_ARGUMENT,
         "BITS within 1..8"),
    ]  # fmt: skip
    for message, code, reason in cases:
        err = refused(receiver, message)
        assert err.code() == code, (reason, err.details())
        assert reason in (err.details() or ""), err.details()
    after = state(receiver)
    assert torch.equal(before[0], after[0]) and before[1:] == after[1:]
    assert receiver.counters().messages_received == 0
    assert receiver.counters().messages_rejected == len(cases)
    # blocks that build on a copy it never held are not taken: the sender starts over
    ack = push(receiver, GossipMessage(header(receiver, seq=4, base_seq=3, scalars={"y1": 0.25}),
                                       good))  # fmt: skip
    assert ack.start_over and not ack.absorbed
    after = state(receiver)
    assert torch.equal(before[0], after[0]) and before[1:] == after[1:]
    # two blocks at once (a replay) are fine, and so is another codec than our own
    fp16 = get_codec("fp16")
    two = join_blocks([fp16.encode(torch.ones(8)), fp16.encode(torch.ones(8))])
    ack = push(receiver, GossipMessage(
        header(receiver, codec="fp16", numel=16, payload_bytes=32, seq=2,
               scalars={"y1": 0.25, "y2": 0.25, "restart": 1.0}), two.data))  # fmt: skip
    assert isinstance(ack, gossip_pb2.PushAck) and ack.absorbed and ack.last_seq == 2
    x, y, edges = state(receiver)
    assert y == pytest.approx(1.5) and edges == 1
    torch.testing.assert_close(x, before[0] + 0.25 * 1 + 0.25 * 2)  # flows y1*copy1 + y2*copy2


def test_quantized_agents_reach_consensus_over_grpc(pair: tuple[Agent, Agent]) -> None:
    assert_pair_reaches_average(pair, timeout_s=120)
