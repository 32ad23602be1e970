"""Conversion between gossip messages and the protobuf chunks that carry them.

Every check of the wire format itself lives here, for every transport that reads chunks:
:func:`parse_chunk` (bytes to a chunk, refusing what is not one) and :class:`PushAssembler`
(the first chunk must carry the header, no other may, the chunks must add up to exactly the
payload size the header announced). Whether the *content* is acceptable is the receiving
agent's business (``InboundHandler.admit`` and ``deliver``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from google.protobuf.message import DecodeError

from edge.transport.base import GossipMessage, MessageHeader, RejectCode, Rejected
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
        receiver=header.receiver,
        fleet=header.fleet,
        epoch=header.epoch,
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
        receiver=proto.receiver,
        fleet=proto.fleet,
        epoch=proto.epoch,
    )


def malformed(reason: str, *, kind: str = "malformed") -> Rejected:
    """The refusal of a stream that breaks the wire format."""
    return Rejected(RejectCode.INVALID_ARGUMENT, reason, kind=kind)


def parse_chunk(data: bytes) -> gossip_pb2.PushChunk:
    """One chunk from its bytes; :class:`Rejected` (``undecodable``) if they are not one.

    Transports receive raw bytes and parse them here rather than in gRPC's deserialiser,
    whose failure path keeps memory per refused call.
    """
    try:
        return gossip_pb2.PushChunk.FromString(data)
    except (DecodeError, ValueError):
        raise malformed("a chunk is not a valid PushChunk message", kind="undecodable") from None


class PushAssembler:
    """Reassembles one push from its chunks, checking the stream's shape as it goes.

    Build it from the first chunk (which must carry the header), let the receiver check
    :attr:`header`, then :meth:`begin` (the payload buffer is only allocated now, once the
    header passed), :meth:`add` every further chunk and take the :meth:`message`. Each step
    raises :class:`Rejected` (``INVALID_ARGUMENT``) for a stream that breaks the format.
    """

    def __init__(self, first: gossip_pb2.PushChunk | None) -> None:
        if first is None or not first.HasField("header"):
            raise malformed("the first chunk of a push must carry the header")
        self.header = header_from_proto(first.header)
        self._first: gossip_pb2.PushChunk | None = first
        self._buffer = bytearray()
        self._offset = 0

    def begin(self) -> None:
        """Allocate the payload buffer and take the first chunk's data."""
        first, self._first = self._first, None
        self._buffer = bytearray(self.header.payload_bytes)
        if first is not None:
            self._take(first.data)

    def add(self, chunk: gossip_pb2.PushChunk) -> None:
        if chunk.HasField("header"):
            raise malformed("only the first chunk may carry a header")
        self._take(chunk.data)

    def _take(self, data: bytes) -> None:
        total, size = self.header.payload_bytes, len(data)
        if self._offset + size > total:
            raise malformed(
                f"chunks carry more than the {total} payload bytes the header announced"
            )
        self._buffer[self._offset : self._offset + size] = data
        self._offset += size

    def message(self) -> GossipMessage:
        """The whole message, once the stream has ended."""
        total = self.header.payload_bytes
        if self._offset != total:
            raise malformed(
                f"stream ended after {self._offset} of the {total} payload bytes the header "
                "announced"
            )
        return GossipMessage(self.header, self._buffer)


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
        h.round.bit_length(), h.seq.bit_length(), h.base_seq.bit_length(), len(h.receiver),
        len(h.fleet), h.epoch.bit_length(),
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
