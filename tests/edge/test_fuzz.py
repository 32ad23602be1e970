"""Property tests (hypothesis) of what an agent reads from the wire.

* chunk decoding: any bytes either parse as a chunk or are refused (``Rejected``), nothing
  else escapes, and exactly as protobuf would parse or refuse them (the transport splits
  chunks in the shape it writes itself, without protobuf: same result);
* framing: the bytes the transport sends are the serialized protobuf chunks, and their size
  is what ``wire_bytes`` counts;
* reassembly: any sequence of chunks is either refused or gives exactly the announced
  payload;
* headers survive the round trip to protobuf and back, whatever their values;
* the push handler (``Agent.admit`` and ``deliver``): any header and payload, mostly near a
  valid one, is either absorbed or refused; a refused one changes nothing, and the agent's
  state stays finite, its weight positive and its estimate within bounds.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from airgossip.common.topology import assignments_for_graph, build_graph
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.algorithms.base import MAX_MAGNITUDE, MAX_WEIGHT
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.transport import GossipMessage, MessageHeader, Rejected
from airgossip.edge.transport.memory import InMemoryNetwork, InMemoryTransport
from airgossip.edge.transport.wire import (
    GRPC_FRAME_BYTES,
    Chunk,
    PushAssembler,
    frames,
    header_from_proto,
    header_to_proto,
    parse_chunk,
    to_chunks,
    wire_bytes,
)
from airgossip.protos import gossip_pb2

PROPERTIES = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
U64 = st.integers(0, 2**64 - 1)
TEXT = st.text(max_size=40)


headers = st.builds(
    MessageHeader,
    sender=TEXT, round=U64, seq=U64, base_seq=U64, algorithm=TEXT, codec=TEXT,
    numel=U64, payload_bytes=st.integers(0, 4096),
    scalars=st.dictionaries(TEXT, st.floats(allow_nan=False), max_size=4),
    fleet_digest=TEXT, codec_meta=st.binary(max_size=64), receiver=TEXT, fleet=TEXT, epoch=U64,
)  # fmt: skip


def protobuf_reading(data: bytes) -> Chunk | None:
    """What protobuf itself makes of ``data`` (None: refused)."""
    try:
        chunk = gossip_pb2.PushChunk.FromString(data)
    except DecodeError:
        return None
    return Chunk(chunk.header if chunk.HasField("header") else None, chunk.data)


@st.composite
def near_frames(draw: st.DrawFn) -> bytes:
    """A frame the transport writes, then bent: cut short, extended, one byte changed."""
    header = draw(headers)
    data = draw(st.binary(max_size=300))
    message = GossipMessage(replace(header, payload_bytes=len(data)), data)
    chunk = draw(st.sampled_from(list(frames(message, draw(st.integers(1, 400))))))
    bend = draw(st.sampled_from(["none", "cut", "extend", "flip"]))
    if bend == "cut" and chunk:
        chunk = chunk[: draw(st.integers(0, len(chunk) - 1))]
    elif bend == "extend":
        chunk += draw(st.binary(min_size=1, max_size=8))
    elif bend == "flip" and chunk:
        at = draw(st.integers(0, len(chunk) - 1))
        chunk = chunk[:at] + bytes([draw(st.integers(0, 255))]) + chunk[at + 1 :]
    return chunk


@PROPERTIES
@given(st.one_of(st.binary(max_size=512), near_frames()))
def test_any_bytes_parse_as_protobuf_parses_them_or_are_refused(data: bytes) -> None:
    expected = protobuf_reading(data)
    try:
        chunk = parse_chunk(data)
    except Rejected as err:
        assert err.kind == "undecodable"
        assert expected is None
        return
    assert expected is not None
    assert isinstance(chunk, Chunk)
    assert chunk.header == expected.header
    assert bytes(chunk.data) == expected.data


@PROPERTIES
@given(headers, st.binary(max_size=2000), st.integers(1, 700))
def test_frames_are_the_serialized_chunks_and_wire_bytes_counts_them(
    header: MessageHeader, data: bytes, chunk_bytes: int
) -> None:
    message = GossipMessage(replace(header, payload_bytes=len(data)), memoryview(data))
    sent = list(frames(message, chunk_bytes))
    assert sent == [
        c.SerializeToString(deterministic=True) for c in to_chunks(message, chunk_bytes)
    ]
    assert wire_bytes(message, chunk_bytes) == sum(GRPC_FRAME_BYTES + len(f) for f in sent)
    assembler = PushAssembler(parse_chunk(sent[0]))
    assembler.begin()
    for frame in sent[1:]:
        assembler.add(parse_chunk(frame))
    assert bytes(assembler.message().data) == data
    assert assembler.header == message.header


@PROPERTIES
@given(headers)
def test_headers_survive_the_round_trip(header: MessageHeader) -> None:
    wire = gossip_pb2.PushChunk(header=header_to_proto(header)).SerializeToString()
    assert header_from_proto(parse_chunk(wire).header) == header


@PROPERTIES
@given(
    headers,
    st.booleans(),
    st.lists(st.tuples(st.booleans(), st.binary(max_size=700)), max_size=8),
)
def test_reassembly_gives_exactly_the_payload_or_refuses(
    header: MessageHeader, first_has_header: bool, rest: list[tuple[bool, bytes]]
) -> None:
    first = gossip_pb2.PushChunk(data=rest[0][1] if rest else b"")
    if first_has_header:
        first.header.CopyFrom(header_to_proto(header))
    chunks = [gossip_pb2.PushChunk(data=d) for _, d in rest[1:]]
    for chunk, (with_header, _) in zip(chunks, rest[1:], strict=True):
        if with_header:
            chunk.header.CopyFrom(header_to_proto(header))
    try:
        assembler = PushAssembler(parse_chunk(first.SerializeToString()))
        assembler.begin()
        for chunk in chunks:
            assembler.add(parse_chunk(chunk.SerializeToString()))
        message = assembler.message()
    except Rejected as err:
        assert err.code.value == "INVALID_ARGUMENT"
        return
    expected = b"".join(d for _, d in rest)
    assert first_has_header and not any(h for h, _ in rest[1:])
    assert bytes(message.data) == expected and len(expected) == header.payload_bytes


# -- the push handler -----------------------------------------------------------------------

SETTINGS = AgentSettings(task=TaskSettings(name="consensus", dim=4), rounds=10, seed=2)


def fresh_agent() -> Agent:
    """agent-0 of a fresh fleet of three (agent-1 and agent-2 are its in-neighbours)."""
    network = InMemoryNetwork()
    agents = [
        build_agent(f"agent-{i}", index=i, num_agents=3, settings=SETTINGS,
                    transport=InMemoryTransport(network, f"agent-{i}"))
        for i in range(3)
    ]  # fmt: skip
    addresses = {a.agent_id: a.start() for a in agents}
    assignments = assignments_for_graph(build_graph("complete", 3), addresses)
    for a in agents:
        a.set_assignment(assignments[a.agent_id])
    return agents[0]


def floats64(values: list[float]) -> bytes:
    return torch.tensor(values, dtype=torch.float64).numpy().tobytes()


#: Bent values for one field of a push: what a hostile or broken sender might put there.
BENT: dict[str, st.SearchStrategy[object]] = {
    "sender": st.sampled_from(["agent-0", "mallory", "", "agent-1\x00"]),
    "receiver": st.sampled_from(["agent-1", "", "agent-00"]),
    "round": st.sampled_from([0, 2**48 + 1, 2**64 - 1]),
    "seq": st.sampled_from([0, 1025, 2**48, 2**48 + 1, 2**64 - 1]),
    "base_seq": st.sampled_from([1, 3, 2**63]),
    "algorithm": st.sampled_from(["dpsgd", "", "push-sum "]),
    "codec": st.sampled_from(["float32", "qsgd:4", "nope", ""]),
    "numel": st.sampled_from([0, 3, 8, 2**40, 2**64 - 1]),
    "payload_bytes": st.sampled_from([0, 16, 40, 1 << 40]),
    "fleet": st.sampled_from(["other-fleet", "x" * 200]),
    "values": st.lists(
        st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                  st.sampled_from([1.7e308, -1.7e308, 1e300, 1e16, 5e-324])),
        min_size=4, max_size=4,
    ),
    "y": st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.0, -5.0, -1e-300, 1e-300, MAX_WEIGHT, 2 * MAX_WEIGHT]),
    ),
    "scalars": st.dictionaries(TEXT, st.floats(), max_size=3),
}  # fmt: skip


@st.composite
def pushes(draw: st.DrawFn) -> list[tuple[dict[str, object], bytes]]:
    """Pushes to agent-0 from its in-neighbours, numbered as senders number them (with the
    odd duplicate or gap), each valid but for up to two bent fields."""
    batch, seqs = [], {"agent-1": 0, "agent-2": 0}
    for _ in range(draw(st.integers(1, 8))):
        fields, data = draw(push())
        sender = str(fields["sender"])
        if sender in seqs and "seq" not in fields:
            seqs[sender] += draw(st.sampled_from([1, 1, 1, 0, 2]))
            fields["seq"] = max(seqs[sender], 1)
        fields.setdefault("seq", 1)
        batch.append((fields, data))
    return batch


@st.composite
def push(draw: st.DrawFn) -> tuple[dict[str, object], bytes]:
    """A valid push to agent-0 from one of its in-neighbours, with up to two fields bent
    (the sequence number is left out unless bent)."""
    bent = draw(st.lists(st.sampled_from(sorted(BENT)), max_size=2, unique=True))
    value = {name: draw(BENT[name]) for name in bent}
    values = value.pop("values", None) or draw(st.lists(st.floats(-10, 10), min_size=4, max_size=4))
    data = floats64(values)  # type: ignore[arg-type]
    y = value.pop("y", None)
    fields: dict[str, object] = dict(
        sender=draw(st.sampled_from(["agent-1", "agent-2"])), receiver="agent-0", round=1,
        base_seq=0, algorithm="push-sum", codec="float64",
        numel=4, payload_bytes=len(data),
        scalars={"y": y if y is not None else draw(st.floats(0.01, 2))}, fleet="", epoch=1,
    )  # fmt: skip
    fields.update(value)
    return fields, data


def bounded(agent: Agent) -> None:
    x, y = agent.algorithm.mass()  # type: ignore[attr-defined]
    assert math.isfinite(y) and 0 < y <= MAX_WEIGHT
    assert bool(torch.isfinite(x).all())
    assert float(x.abs().max()) <= MAX_MAGNITUDE * y


@PROPERTIES
@given(pushes())
def test_the_push_handler_absorbs_or_refuses_and_stays_in_bounds(
    batch: list[tuple[dict[str, object], bytes]],
) -> None:
    agent = fresh_agent()
    for fields, data in batch:
        header = MessageHeader(fleet_digest=agent.digest, **fields)  # type: ignore[arg-type]
        before = agent.algorithm.mass()  # type: ignore[attr-defined]
        try:
            agent.admit(header)
            if len(data) == header.payload_bytes:  # else the transport refuses the stream
                ack = agent.deliver(GossipMessage(header, bytearray(data)))
                event("absorbed" if ack.absorbed else "duplicate")
        except Rejected as err:
            event(err.kind)
            after = agent.algorithm.mass()  # type: ignore[attr-defined]
            assert torch.equal(before[0], after[0]) and before[1] == after[1]
        bounded(agent)
        agent.mix(1)
        bounded(agent)


def test_the_unbent_push_of_the_strategy_is_absorbed() -> None:
    """The strategy's template is a valid push (so the property above sees absorptions)."""
    agent = fresh_agent()
    header = MessageHeader(
        "agent-1", 1, 1, 0, "push-sum", "float64", 4, 32, {"y": 0.5}, agent.digest,
        receiver="agent-0", fleet="", epoch=1,
    )  # fmt: skip
    agent.admit(header)
    assert agent.deliver(GossipMessage(header, bytearray(floats64([1, 2, 3, 4])))).absorbed
