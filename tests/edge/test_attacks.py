"""The attacks of an adversary who can reach an agent's port, over real gRPC with mutual TLS.

A live consensus fleet of four agents (in this process, each on its own TLS port, the
exponential graph: agent-1 hears from agent-0 and agent-3). Each test attacks agent-1 the
way an attacker would, checks that the attack is refused and agent-1's state unchanged, and
then lets the fleet run: it must still reach the exact average (relative error < 1e-6).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator

import grpc
import pytest
import torch

from airgossip.common.security.certificates import load_authority, make_authority, make_certificate
from airgossip.common.security.tls import TlsCredentials, dial
from airgossip.edge.agent import Agent
from airgossip.edge.transport import GossipMessage, MessageHeader
from airgossip.edge.transport.base import SendCallback, Transport
from airgossip.edge.transport.wire import to_chunks
from airgossip.protos import gossip_pb2_grpc
from tests.support.agents import TlsFleet, push, refused
from tests.support.tls import credentials, credentials_folder


@pytest.fixture
def fleet() -> Iterator[TlsFleet]:
    fleet = TlsFleet(4)
    yield fleet
    fleet.close()


def state(agent: Agent) -> list[torch.Tensor]:
    x, y = agent.algorithm.mass()  # type: ignore[attr-defined]
    sums = [agent.algorithm.in_edge_sum(s) for s in ("agent-0", "agent-3")]  # type: ignore[attr-defined]
    flat = [x.clone(), torch.tensor([y])]
    for rho_x, rho_y, base in sums:
        flat += [rho_x, torch.tensor([rho_y, base])]
    return flat


def assert_unchanged(before: list[torch.Tensor], agent: Agent) -> None:
    for a, b in zip(before, state(agent), strict=True):
        assert torch.equal(a, b)


def header(target: Agent, **overrides: object) -> MessageHeader:
    fields: dict[str, object] = dict(
        sender="agent-3", receiver=target.agent_id, round=1, seq=1, base_seq=0,
        algorithm="push-sum", codec="float64", numel=8, payload_bytes=64, scalars={"y": 0.25},
        fleet_digest=target.digest, fleet=target.fleet,
    )  # fmt: skip
    fields.update(overrides)
    return MessageHeader(**fields)  # type: ignore[arg-type]


def values(*items: float) -> bytes:
    return torch.tensor(items, dtype=torch.float64).numpy().tobytes()


def push_with(security: TlsCredentials | None, target: Agent, message: GossipMessage) -> None:
    """Push with arbitrary credentials (None: a plaintext client)."""
    if security is None:
        channel = grpc.insecure_channel(target.address)
    else:
        channel = dial(target.address, target.agent_id, security)
    with channel:
        gossip_pb2_grpc.GossipStub(channel).Push(to_chunks(message, 16), timeout=5)


def finish(fleet: TlsFleet) -> None:
    fleet.run_to_end()
    assert fleet.relative_error() < 1e-6


def test_clients_without_a_valid_certificate_never_get_through(fleet: TlsFleet) -> None:
    target = fleet["agent-1"]
    before = state(target)
    message = GossipMessage(header(target), values(*range(8)))
    now = datetime.datetime.now(datetime.timezone.utc)
    authority, key = load_authority(credentials_folder())
    ca_pem = credentials("agent-3").ca_pem
    expired = TlsCredentials("agent-3", ca_pem, *make_certificate(
        authority, key, "agent-3", not_before=now - datetime.timedelta(days=3),
        not_after=now - datetime.timedelta(days=1),
    ))  # fmt: skip
    other_ca, other_key = make_authority("another fleet")
    foreign = TlsCredentials("agent-3", ca_pem, *make_certificate(other_ca, other_key, "agent-3"))
    no_certificate = grpc.ssl_channel_credentials(ca_pem)  # trusts the server, shows nothing
    for who, security in [("plaintext", None), ("expired", expired), ("other CA", foreign)]:
        with pytest.raises(grpc.RpcError) as info:
            push_with(security, target, message)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, who
    options = [("grpc.ssl_target_name_override", "agent-1")]
    with grpc.secure_channel(target.address, no_certificate, options=options) as channel:
        with pytest.raises(grpc.RpcError) as info:
            gossip_pb2_grpc.GossipStub(channel).Push(to_chunks(message, 16), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert_unchanged(before, target)
    assert target.counters().messages_received == 0
    finish(fleet)


def test_a_certificate_cannot_speak_for_another_agent(fleet: TlsFleet) -> None:
    target = fleet["agent-1"]
    before = state(target)
    # agent-3 (an in-neighbour) claims to be agent-0 (another in-neighbour)
    err = refused(target, GossipMessage(header(target, sender="agent-0"), values(*range(8))),
                  identity="agent-3")  # fmt: skip
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "not the certificate's identity 'agent-3'" in (err.details() or "")
    # a valid certificate of the fleet that is not an in-neighbour: refused before a byte
    err = refused(target, GossipMessage(header(target, sender="agent-0"), values(*range(8))),
                  identity="agent-2")  # fmt: skip
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'agent-2' is not an in-neighbour of agent-1" in (err.details() or "")
    assert_unchanged(before, target)
    finish(fleet)


class Recording:
    """Forwards sends to the real transport and keeps a copy of every message."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.sent: list[tuple[str, GossipMessage]] = []

    def start(self, handler: object) -> str:
        raise AssertionError("already started")

    def send(self, peer: str, address: str, message: GossipMessage, done: SendCallback) -> None:
        self.sent.append((peer, message))
        self.inner.send(peer, address, message, done)

    def close(self) -> None:
        self.inner.close()


def first_round_of(sender: Agent) -> Recording:
    """Let ``sender`` run its first round's push, genuinely, recording what it sends."""
    recording = Recording(sender.transport)
    sender.transport = recording
    sender.local_step(1)
    sender.push(1)
    deadline = time.monotonic() + 10
    while sender.counters().messages_sent < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sender.counters().messages_sent == 2
    return recording


def test_a_genuine_message_replayed_on_another_edge_is_refused(fleet: TlsFleet) -> None:
    recording = first_round_of(fleet["agent-3"])  # agent-3 -> agent-0 and -> agent-1
    captured = next(m for peer, m in recording.sent if peer == "agent-1")
    other = fleet["agent-0"]  # agent-3 is an in-neighbour of agent-0 too
    before = state(fleet["agent-1"])
    err = refused(other, captured, identity="agent-3")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "message for 'agent-1' sent to agent-0" in (err.details() or "")
    ack = push(fleet["agent-1"], captured)  # on its own edge: a duplicate, nothing new
    assert not ack.absorbed
    assert_unchanged(before, fleet["agent-1"])
    finish(fleet)


@pytest.mark.parametrize(
    ("overrides", "data", "fragment"),
    [
        ({}, values(*[1.7e308] * 8), "carries values up to"),
        ({}, values(*[1e308] * 8), "carries values up to"),
        ({"scalars": {"y": -5.0}}, values(*range(8)), "positive weight 'y'"),
        ({"scalars": {"y": 0.0}}, values(*range(8)), "positive weight 'y'"),
        ({"seq": 2**64 - 1}, values(*range(8)), "too far ahead"),
    ],
    ids=["x=1.7e308", "x=1e308", "y=-5", "y=0", "seq=2^64-1"],
)
def test_pushes_that_would_bend_the_state_are_refused(
    fleet: TlsFleet, overrides: dict[str, object], data: bytes, fragment: str
) -> None:
    target = fleet["agent-1"]
    first_round_of(fleet["agent-3"])  # the edge agent-3 -> agent-1 holds seq 1 now
    before = state(target)
    for _ in range(2):  # twice: two finite pushes once summed to infinity
        err = refused(target, GossipMessage(header(target, **{"seq": 2, **overrides}), data))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in (err.details() or ""), err.details()
    assert_unchanged(before, target)
    finish(fleet)
