"""Conversion between gossip messages and the ``PushChunk`` messages that carry them.

A push is a stream of ``PushChunk`` protobuf messages (``protos/gossip.proto``): the first
carries the header, each carries a slice of one flat buffer. The transport writes and reads
their canonical encoding itself rather than building a protobuf message per chunk: a chunk
is the header field (``0x0A``, its length, the serialized header; first chunk only) then
the data field (``0x12``, its length, the slice), so :func:`frames` builds each one with a
single copy of its slice out of the flat buffer, and :func:`parse_chunk` hands back the
slice as a view of the received bytes. Anything not in that exact shape (other field
orders, unknown fields: still valid protobuf) is parsed by protobuf itself, so the wire
format is exactly the ``.proto``'s and any client of it (a generated stub) is understood.

Every check of the wire format itself lives here, for every transport that reads chunks:
:func:`parse_chunk` (bytes to a chunk, refusing what is not one) and :class:`PushAssembler`
(the first chunk must carry the header, no other may, the chunks must add up to exactly the
payload size the header announced; the payload buffer is allocated only once the header
has been checked). Whether the *content* is acceptable is the receiving agent's business
(``InboundHandler.admit`` and ``deliver``).
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from airgossip.edge.transport.base import GossipMessage, MessageHeader, RejectCode, Rejected
from airgossip.protos import gossip_pb2

#: Bytes of payload per chunk: well under gRPC's default 4 MiB message limit.
CHUNK_BYTES = 1 << 20
#: gRPC's length-prefixed framing adds 5 bytes to every message of a stream.
GRPC_FRAME_BYTES = 5
#: Upper bound for header-only fields (ids, scalars, codec meta) in the first chunk.
MAX_HEADER_BYTES = 64 << 10
#: ``PushChunk``'s fields on the wire: field number << 3 | 2 (length-delimited).
HEADER_TAG = 0x0A
DATA_TAG = 0x12
#: A protobuf varint is at most 10 bytes.
_MAX_VARINT_BYTES = 10


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
        lineage=header.lineage,
        step=header.step,
        steps=header.steps,
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
        lineage=proto.lineage,
        step=proto.step,
        steps=proto.steps,
    )


def malformed(reason: str, *, kind: str = "malformed") -> Rejected:
    """The refusal of a stream that breaks the wire format."""
    return Rejected(RejectCode.INVALID_ARGUMENT, reason, kind=kind)


@dataclass(frozen=True)
class Chunk:
    """One received ``PushChunk``: its header (first chunk only) and its slice of payload.

    ``data`` is a view of the received bytes where they were in the canonical shape (no
    copy until the assembler places it), else protobuf's own ``bytes``.
    """

    header: gossip_pb2.MessageHeader | None
    data: bytes | memoryview


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_length(data: bytes, pos: int) -> tuple[int, int] | None:
    """The varint at ``pos`` and where it ends; None if it runs off the end or is too long."""
    value = shift = 0
    for index in range(pos, min(pos + _MAX_VARINT_BYTES, len(data))):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, index + 1
        shift += 7
    return None


def _canonical(data: bytes) -> tuple[memoryview | None, memoryview] | None:
    """Header bytes and payload slice of a chunk in the shape :func:`frames` writes (an
    optional header field, then an optional data field ending exactly at the end); None for
    any other shape."""
    view = memoryview(data)
    end, pos, header = len(data), 0, None
    if pos < end and data[pos] == HEADER_TAG:
        read = _read_length(data, pos + 1)
        if read is None or read[1] + read[0] > end:
            return None
        header, pos = view[read[1] : read[1] + read[0]], read[1] + read[0]
    if pos == end:
        return header, view[end:]
    if data[pos] != DATA_TAG:
        return None
    read = _read_length(data, pos + 1)
    if read is None or read[1] + read[0] != end:
        return None
    return header, view[read[1] :]


def parse_chunk(data: bytes) -> Chunk:
    """One chunk from its bytes; :class:`Rejected` (``undecodable``) if they are not one.

    Transports receive raw bytes and parse them here rather than in gRPC's deserialiser,
    whose failure path keeps memory per refused call. A chunk in the canonical shape is
    split without copying its payload (the header, a few hundred bytes, is parsed by
    protobuf); any other is parsed whole by protobuf, so both give what
    ``PushChunk.FromString`` gives, or refuse what it refuses.
    """
    try:
        canonical = _canonical(data)
        if canonical is not None:
            header_bytes, payload = canonical
            if header_bytes is None:
                return Chunk(None, payload)
            # The header is small (a few hundred bytes): a copy costs nothing here.
            return Chunk(gossip_pb2.MessageHeader.FromString(bytes(header_bytes)), payload)
        chunk = gossip_pb2.PushChunk.FromString(data)
    except (DecodeError, ValueError):
        raise malformed("a chunk is not a valid PushChunk message", kind="undecodable") from None
    return Chunk(chunk.header if chunk.HasField("header") else None, chunk.data)


def _holders(buffers: list[bytearray], index: int) -> int:
    """References to ``buffers[index]``, counted the same way wherever it is asked."""
    return sys.getrefcount(buffers[index])


#: What :func:`_holders` says of a buffer nothing but its list holds: measured through the
#: very call that checks the pool's buffers, so that it holds whatever the interpreter
#: counts of a call's own references.
_HELD_BY_LIST_ONLY = _holders([bytearray(1)], 0)


class PayloadBuffers:
    """Payload buffers reused from one push to the next.

    A fresh buffer costs more than receiving into it: ``bytearray(n)`` zeroes every page of
    it, each a page fault the first time (about 16 ms for 40 MB here, most of a push). A
    buffer handed out before is reused only once nothing but this pool refers to it: no
    message, tensor (``torch.frombuffer`` keeps the buffer), view or array of the receiver's
    is left on it, so a receiver that keeps what it was given keeps it intact. At most
    ``limit`` buffers are kept; beyond that (or where the interpreter keeps no reference
    counts) every push gets a fresh one.
    """

    def __init__(self, limit: int = 2) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._buffers: list[bytearray] = []
        self._counted = hasattr(sys, "getrefcount")

    def take(self, size: int) -> bytearray:
        """A buffer of exactly ``size`` bytes (its content is overwritten by the caller)."""
        if not self._counted or size == 0:
            return bytearray(size)
        with self._lock:
            unused = [
                i
                for i in range(len(self._buffers))
                if _holders(self._buffers, i) == _HELD_BY_LIST_ONLY
            ]
            for i in unused:
                if len(self._buffers[i]) == size:
                    return self._buffers[i]
            if unused and len(self._buffers) >= self.limit:
                del self._buffers[unused[0]]  # a size no longer asked for
            if len(self._buffers) >= self.limit:
                return bytearray(size)
            buffer = bytearray(size)
            self._buffers.append(buffer)
            return buffer

    def held_bytes(self) -> int:
        """Bytes of the buffers the pool keeps (handed out or not)."""
        with self._lock:
            return sum(len(b) for b in self._buffers)


class PushAssembler:
    """Reassembles one push from its chunks, checking the stream's shape as it goes.

    Build it from the first chunk (which must carry the header), let the receiver check
    :attr:`header`, then :meth:`begin` (the payload buffer is only allocated now, once the
    header passed), :meth:`add` every further chunk and take the :meth:`message`. Each step
    raises :class:`Rejected` (``INVALID_ARGUMENT``) for a stream that breaks the format.
    Every chunk's slice is copied once, straight into the payload buffer.
    """

    def __init__(self, first: Chunk | None) -> None:
        if first is None or first.header is None:
            raise malformed("the first chunk of a push must carry the header")
        self.header = header_from_proto(first.header)
        self._first: Chunk | None = first
        self._buffer = bytearray()
        self._offset = 0

    def begin(self, allocate: Callable[[int], bytearray] = bytearray) -> None:
        """Allocate the payload buffer (``allocate(size)``, e.g. :meth:`PayloadBuffers.take`)
        and take the first chunk's data."""
        first, self._first = self._first, None
        self._buffer = allocate(self.header.payload_bytes)
        if first is not None:
            self._take(first.data)

    def add(self, chunk: Chunk) -> None:
        if chunk.header is not None:
            raise malformed("only the first chunk may carry a header")
        self._take(chunk.data)

    def _take(self, data: bytes | memoryview) -> None:
        total, size = self.header.payload_bytes, len(data)
        if self._offset + size > total:
            raise malformed(
                f"chunks carry more than the {total} payload bytes the header announced"
            )
        self._buffer[self._offset : self._offset + size] = data
        self._offset += size

    @property
    def received(self) -> int:
        """Payload bytes in place so far."""
        return self._offset

    def receive(self, fill: Callable[[memoryview, Callable[[int], None]], None]) -> None:
        """Fill the rest of the payload in place (the bulk path): ``fill(view, arrived)``
        writes into ``view`` from its start, calls ``arrived(n)`` as each ``n`` bytes land,
        and raises to refuse the push (what arrived stays counted: :meth:`take_over`)."""

        def arrived(n: int) -> None:
            self._offset += n

        with memoryview(self._buffer) as whole, whole[self._offset :] as rest:
            fill(rest, arrived)

    def take_over(self, cut: PushAssembler) -> None:
        """Continue a cut push of the same header instead of :meth:`begin`: its buffer and
        what it received."""
        self._first = None
        self._buffer, self._offset = cut._buffer, cut._offset

    def message(self) -> GossipMessage:
        """The whole message, once the stream has ended."""
        total = self.header.payload_bytes
        if self._offset != total:
            raise malformed(
                f"stream ended after {self._offset} of the {total} payload bytes the header "
                "announced"
            )
        return GossipMessage(self.header, self._buffer)


def frames(message: GossipMessage, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Yield the message as the bytes of its chunks, what the transport sends.

    Each is the encoding of the ``PushChunk`` :func:`to_chunks` gives (header + first slice,
    then further slices; ``SerializeToString(deterministic=True)``'s very bytes), built with
    one copy of its slice out of the flat buffer and no protobuf message per chunk.
    """
    data = memoryview(message.data).cast("B")
    header = header_to_proto(message.header).SerializeToString(deterministic=True)
    first = data[:chunk_bytes]
    parts: list[bytes | memoryview] = [bytes((HEADER_TAG,)), _varint(len(header)), header]
    if len(first):
        parts += [bytes((DATA_TAG,)), _varint(len(first)), first]
    yield b"".join(parts)
    yield from data_frames(data[chunk_bytes:], chunk_bytes)


def data_frames(data: memoryview, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The chunks of ``data`` without a header (what follows a header-only first chunk)."""
    for offset in range(0, len(data), chunk_bytes):
        piece = data[offset : offset + chunk_bytes]
        yield b"".join((bytes((DATA_TAG,)), _varint(len(piece)), piece))


def to_chunks(
    message: GossipMessage, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[gossip_pb2.PushChunk]:
    """Yield the message as protobuf chunks: header + first slice, then further slices.

    What a generated stub sends; the same bytes as :func:`frames` once serialized.
    """
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


def _utf8(text: str) -> int:
    """Bytes of ``text`` on the wire (UTF-8), not its length in characters."""
    return len(text) if text.isascii() else len(text.encode())


def wire_bytes(message: GossipMessage, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Bytes the message takes on the wire as :func:`frames` (or :func:`to_chunks`) frames it.

    Counts every protobuf chunk and gRPC's 5-byte frame per chunk (not HTTP/2 or TCP/IP
    headers), exactly what ``sum(GRPC_FRAME_BYTES + c.ByteSize() for c in to_chunks(m))``
    gives, without building the chunks (memoised on what determines the size).
    """
    h = message.header
    key = (
        len(message.data), chunk_bytes, h.payload_bytes, h.numel, h.codec, _utf8(h.sender),
        _utf8(h.algorithm), _utf8(h.fleet_digest), len(h.codec_meta), tuple(sorted(h.scalars)),
        h.round.bit_length(), h.seq.bit_length(), h.base_seq.bit_length(), _utf8(h.receiver),
        _utf8(h.fleet), h.epoch.bit_length(), h.lineage.bit_length(), h.step.bit_length(),
        h.steps.bit_length(),
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
