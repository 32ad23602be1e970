"""Conversion between gossip messages and the protobuf chunks that carry them."""

from __future__ import annotations

import math
from collections.abc import Iterator

from edge.transport.base import GossipMessage, MessageHeader
from protos import gossip_pb2

#: Bytes of payload per chunk: well under gRPC's default 4 MiB message limit.
CHUNK_BYTES = 1 << 20
#: gRPC's length-prefixed framing adds 5 bytes to every message of a stream.
GRPC_FRAME_BYTES = 5
#: Upper bound for header-only fields (ids, scalars, codec meta) in the first chunk.
MAX_HEADER_BYTES = 64 << 10


def header_to_proto(header: MessageHeader) -> gossip_pb2.MessageHeader:
    return gossip_pb2.MessageHeader(
        sender=header.sender,
        round=header.round,
        seq=header.seq,
        base_seq=header.base_seq,
        algorithm=header.algorithm,
        codec=header.codec,
        numel=header.numel,
        payload_bytes=header.payload_bytes,
        scalars=header.scalars,
        fleet_digest=header.fleet_digest,
        codec_meta=header.codec_meta,
    )


def header_from_proto(proto: gossip_pb2.MessageHeader) -> MessageHeader:
    return MessageHeader(
        sender=proto.sender,
        round=proto.round,
        seq=proto.seq,
        base_seq=proto.base_seq,
        algorithm=proto.algorithm,
        codec=proto.codec,
        numel=proto.numel,
        payload_bytes=proto.payload_bytes,
        scalars=dict(proto.scalars),
        fleet_digest=proto.fleet_digest,
        codec_meta=bytes(proto.codec_meta),
    )


def to_chunks(
    message: GossipMessage, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[gossip_pb2.PushChunk]:
    """Yield the message as chunks: header + first slice, then further slices."""
    data = memoryview(message.data).cast("B")
    yield gossip_pb2.PushChunk(
        header=header_to_proto(message.header), data=bytes(data[:chunk_bytes])
    )
    for offset in range(chunk_bytes, len(data), chunk_bytes):
        yield gossip_pb2.PushChunk(data=bytes(data[offset : offset + chunk_bytes]))


def _varint_size(value: int) -> int:
    return max(1, math.ceil(value.bit_length() / 7))


#: Wire sizes by everything that changes them: lengths of strings and bytes, the scalar names
#: (values are fixed-width doubles), varint widths of the integers. Building a protobuf
#: header per message is a large share of a big in-process fleet's time.
_SIZES: dict[tuple[object, ...], int] = {}
_SIZES_LIMIT = 1 << 16


def wire_bytes(message: GossipMessage, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Bytes the message takes on the wire as :func:`to_chunks` frames it.

    Counts every protobuf chunk and gRPC's 5-byte frame per chunk (not HTTP/2 or TCP/IP
    headers), exactly what ``sum(GRPC_FRAME_BYTES + c.ByteSize() for c in to_chunks(m))``
    gives, without building the chunks (memoised on what determines the size).
    """
    h = message.header
    key = (
        len(message.data), chunk_bytes, h.payload_bytes, h.numel, h.codec, len(h.sender),
        len(h.algorithm), len(h.fleet_digest), len(h.codec_meta), tuple(sorted(h.scalars)),
        h.round.bit_length(), h.seq.bit_length(), h.base_seq.bit_length(),
    )  # fmt: skip
    size = _SIZES.get(key)
    if size is None:
        if len(_SIZES) >= _SIZES_LIMIT:
            _SIZES.clear()
        size = _SIZES[key] = _wire_bytes(message, chunk_bytes)
    return size


def _wire_bytes(message: GossipMessage, chunk_bytes: int) -> int:
    header = gossip_pb2.PushChunk(header=header_to_proto(message.header)).ByteSize()
    total = len(message.data)
    sizes = [min(chunk_bytes, total - off) for off in range(0, total, chunk_bytes)] or [0]
    out = header + GRPC_FRAME_BYTES
    for index, size in enumerate(sizes):
        if size:
            out += 1 + _varint_size(size) + size
        if index:
            out += GRPC_FRAME_BYTES
    return out
