"""The gRPC transport's own framing over real gRPC on loopback, and its reused buffers.

The sender writes each chunk's bytes itself (no protobuf message per chunk, no serializer
on ``Push``); the receiver splits them without copying and places every slice straight into
a payload buffer it reuses once the agent has let go of it. Checked here: large payloads
arrive intact in plaintext and over mutual TLS; a message the receiver keeps is never
overwritten by a later push; bent frames (cut short, oversized, garbage, overrunning or
falling short of the announced payload, a second header) get a clear refusal, and a header
refused by the receiver costs no payload buffer.
"""

from __future__ import annotations

import ctypes.util
import sys
import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import torch

from airgossip.common.security.tls import TlsCredentials, dial
from airgossip.edge.algorithms.base import Ack
from airgossip.edge.transport import GossipMessage, MessageHeader, Rejected
from airgossip.edge.transport.allocator import settle_allocator
from airgossip.edge.transport.base import RejectCode, SendOutcome
from airgossip.edge.transport.grpc_server import SERVICE_NAME
from airgossip.edge.transport.grpc_transport import GrpcTransport
from airgossip.edge.transport.wire import CHUNK_BYTES, MAX_HEADER_BYTES, PayloadBuffers, frames
from airgossip.protos import gossip_pb2
from tests.support.tls import credentials

#: The most a test receiver takes (its ``admit`` refuses larger announcements).
LIMIT = 8 << 20


class Keeper:
    """A receiver that keeps every message it is given (or only acknowledges them)."""

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.messages: list[GossipMessage] = []
        self.buffer_ids: list[int] = []
        self.refusals: list[Rejected] = []

    def accepts(self, sender: str) -> None:
        pass

    def admit(self, header: MessageHeader) -> None:
        if header.payload_bytes > LIMIT:
            raise Rejected(RejectCode.INVALID_ARGUMENT, "payload too large", kind="too_large")

    def deliver(self, message: GossipMessage) -> Ack:
        self.buffer_ids.append(id(message.data))
        if self.keep:
            self.messages.append(message)
        return Ack(message.header.seq, 0, True, message.header.round)

    def refused(self, error: Rejected) -> None:
        self.refusals.append(error)


def header(seq: int, payload_bytes: int, sender: str = "agent-1") -> MessageHeader:
    return MessageHeader(
        sender=sender, receiver="agent-0", round=seq, seq=seq, base_seq=0,
        algorithm="push-sum", codec="float32", numel=payload_bytes // 4,
        payload_bytes=payload_bytes, scalars={"y": 0.5},
    )  # fmt: skip


def send(sender: GrpcTransport, address: str, message: GossipMessage) -> SendOutcome:
    done = threading.Event()
    outcomes: list[SendOutcome] = []

    def finished(outcome: SendOutcome) -> None:
        outcomes.append(outcome)
        done.set()

    sender.send("agent-0", address, message, finished)
    assert done.wait(60)
    return outcomes[0]


@pytest.fixture(params=[False, True], ids=["plaintext", "tls"])
def link(request: pytest.FixtureRequest) -> Iterator[tuple[GrpcTransport, GrpcTransport]]:
    """A receiver (agent-0) and a sender (agent-1), over mutual TLS or in plaintext."""
    secure: bool = request.param
    receiver = GrpcTransport("agent-0", security=credentials("agent-0") if secure else None)
    sender = GrpcTransport("agent-1", security=credentials("agent-1") if secure else None)
    yield receiver, sender
    sender.close()
    receiver.close()


def test_large_pushes_arrive_intact_and_kept_messages_are_never_overwritten(
    link: tuple[GrpcTransport, GrpcTransport],
) -> None:
    receiver, sender = link
    keeper = Keeper()
    address = receiver.start(keeper)
    size = 3 * CHUNK_BYTES + 12  # several chunks and a short last one
    payloads = [np.random.default_rng(seed).bytes(size) for seed in range(4)]
    for seq, payload in enumerate(payloads, start=1):
        # Sent from a view of a float array, as an agent's encoded buffer would be.
        data = memoryview(np.frombuffer(payload, dtype=np.uint8)).cast("B")
        outcome = send(sender, address, GossipMessage(header(seq, size), data))
        assert outcome.delivered, outcome.error
        assert outcome.ack is not None and outcome.ack.last_seq == seq
    assert [bytes(m.data) for m in keeper.messages] == payloads
    assert [m.header for m in keeper.messages] == [header(s, size) for s in range(1, 5)]
    assert len(set(keeper.buffer_ids)) == 4  # every kept message has a buffer of its own
    assert receiver.buffers.held_bytes() <= receiver.buffers.limit * size
    assert not keeper.refusals


def test_a_receiver_that_lets_go_receives_into_the_same_buffer(
    link: tuple[GrpcTransport, GrpcTransport],
) -> None:
    receiver, sender = link
    keeper = Keeper(keep=False)
    address = receiver.start(keeper)
    size = 2 * CHUNK_BYTES + 4
    for seq in range(1, 4):
        data = np.full(size, seq, dtype=np.uint8)
        assert send(sender, address, GossipMessage(header(seq, size), data.data)).delivered
    assert len(set(keeper.buffer_ids)) == 1
    assert receiver.buffers.held_bytes() == size


def test_payload_buffers_are_reused_only_once_nothing_else_holds_them() -> None:
    pool = PayloadBuffers(limit=2)
    first = pool.take(64)
    first[:] = b"a" * 64
    second = pool.take(64)
    assert second is not first  # ours still holds the first one
    view = memoryview(second)
    tensor = torch.frombuffer(first, dtype=torch.uint8)
    del first, second
    third = pool.take(64)  # both in use: by the tensor and by the view
    assert third is not view.obj and third.count(b"a") == 0
    assert bytes(tensor) == b"a" * 64
    assert pool.held_bytes() == 128  # beyond its limit a buffer is not kept
    del tensor
    again = pool.take(64)
    assert again.count(b"a") == 64  # the first one, back once the tensor was gone
    del again, view
    larger = pool.take(100)  # a new size takes the place of one no longer in use
    assert pool.held_bytes() == 164
    assert len(larger) == 100
    assert pool.take(0) == bytearray()


def raw_push(address: str, chunks: list[bytes], security: TlsCredentials | None) -> grpc.RpcError:
    """Push exactly these frames; return the error the receiver answered with."""
    options = [("grpc.max_send_message_length", 2 * (CHUNK_BYTES + MAX_HEADER_BYTES))]
    with dial(address, "agent-0", security, options) as channel:
        push = channel.stream_unary(
            f"/{SERVICE_NAME}/Push", response_deserializer=gossip_pb2.PushAck.FromString
        )
        with pytest.raises(grpc.RpcError) as info:
            push(iter(chunks), timeout=10)
    return info.value


def test_bent_frames_are_refused_with_a_clear_reason(
    link: tuple[GrpcTransport, GrpcTransport],
) -> None:
    receiver, sender = link
    keeper = Keeper()
    address = receiver.start(keeper)
    security = sender.security
    size = CHUNK_BYTES + 100
    good = list(frames(GossipMessage(header(1, size), bytes(size))))
    longer = list(frames(GossipMessage(header(1, size - 8), bytes(size))))
    oversized = gossip_pb2.PushChunk(data=bytes(CHUNK_BYTES + MAX_HEADER_BYTES)).SerializeToString()
    announced = list(frames(GossipMessage(header(1, 1 << 30), bytes(size))))
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        ([good[0][:-10], good[1]], invalid, "not a valid PushChunk"),
        ([good[0], good[1][:3]], invalid, "not a valid PushChunk"),
        ([b"\xff\xff\xff garbage"], invalid, "not a valid PushChunk"),
        ([good[1]], invalid, "first chunk of a push must carry the header"),
        ([good[0], good[0]], invalid, "only the first chunk may carry a header"),
        (good[:1], invalid, f"stream ended after {CHUNK_BYTES} of the {size} payload bytes"),
        (longer, invalid, f"more than the {size - 8} payload bytes"),
        ([good[0], oversized], grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
        (announced, invalid, "payload too large"),
    ]
    for chunks, code, reason in cases:
        err = raw_push(address, chunks, security)
        assert err.code() == code, (reason, err.details())
        assert reason in (err.details() or ""), (reason, err.details())
    assert not keeper.messages
    # Every refusal of the stream's shape reached the handler; admit's own refusal it counted
    # itself. gRPC enforces its size limit before the handler sees the frame: the handler
    # sees either nothing more or the stream end short, whichever comes first.
    assert len(cases) - 2 <= len(keeper.refusals) <= len(cases) - 1
    assert all(r.code == RejectCode.INVALID_ARGUMENT for r in keeper.refusals)
    # The header announcing 1 GiB was refused before any payload buffer was allocated.
    assert receiver.buffers.held_bytes() <= receiver.buffers.limit * size
    good_push = GossipMessage(header(2, size), bytes(size))
    assert send(sender, address, good_push).delivered
    assert bytes(keeper.messages[0].data) == bytes(size)


def test_the_allocator_is_settled_once_where_glibc_runs() -> None:
    glibc = sys.platform.startswith("linux") and "musl" not in (ctypes.util.find_library("c") or "")
    assert settle_allocator() is glibc
    assert settle_allocator() is glibc  # once per process: the same answer, nothing redone
