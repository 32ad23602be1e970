"""Codecs and wire chunking: round trips for odd sizes and dtypes, and what decoding refuses."""

from __future__ import annotations

import pytest
import torch

from airgossip.edge.compression import CODECS, DecodeError, Encoded, get_codec
from airgossip.edge.transport import GossipMessage, MessageHeader
from airgossip.edge.transport.wire import GRPC_FRAME_BYTES, to_chunks, wire_bytes

SIZES = [0, 1, 3, 7, 1023, 262_145]


@pytest.mark.parametrize("spec", ["float64", "float32"])
@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("source", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_lossless_codecs_round_trip(spec: str, numel: int, source: torch.dtype) -> None:
    vector = torch.randn(numel, generator=torch.Generator().manual_seed(numel)).to(source)
    codec = get_codec(spec)
    encoded = codec.encode(vector)
    assert len(encoded.data) == codec.max_bytes(numel)
    decoded = codec.decode(encoded, torch.float64)
    torch.testing.assert_close(decoded, vector.to(torch.float64), rtol=0, atol=0)


@pytest.mark.parametrize(("spec", "tolerance"), [("fp16", 1e-3), ("bf16", 8e-3)])
@pytest.mark.parametrize("numel", SIZES)
def test_narrow_codecs_round_trip_within_their_precision(
    spec: str, tolerance: float, numel: int
) -> None:
    vector = torch.rand(numel, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 1
    codec = get_codec(spec)
    encoded = codec.encode(vector)
    assert len(encoded.data) == 2 * numel
    decoded = codec.decode(encoded, torch.float32)
    assert decoded.dtype == torch.float32
    torch.testing.assert_close(decoded, vector.float(), rtol=tolerance, atol=0)


def test_decoding_checks_the_byte_count() -> None:
    codec = get_codec("float32")
    with pytest.raises(DecodeError, match="10 payload bytes for 3 elements, expected 12"):
        codec.decode(Encoded("float32", 3, b"\0" * 10), torch.float32)


def test_unknown_codec_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"choose one of: .*float32"):
        get_codec("zstd")
    assert {"float64", "float32", "fp16", "bf16"} <= set(CODECS)


def _message(nbytes: int) -> GossipMessage:
    header = MessageHeader(
        sender="agent-1", round=3, seq=9, base_seq=7, algorithm="push-sum", codec="float32",
        numel=nbytes // 4, payload_bytes=nbytes, scalars={"y": 0.5}, fleet_digest="abc",
    )  # fmt: skip
    return GossipMessage(header, bytes(range(256)) * (nbytes // 256) + bytes(nbytes % 256))


@pytest.mark.parametrize("nbytes", [0, 4, 1000, 1 << 16, (1 << 16) + 4, 5 * (1 << 16) - 4])
def test_chunks_reassemble_and_wire_bytes_is_exact(nbytes: int) -> None:
    message = _message(nbytes)
    chunks = list(to_chunks(message, chunk_bytes=1 << 16))
    assert chunks[0].HasField("header")
    assert not any(c.HasField("header") for c in chunks[1:])
    assert all(len(c.data) <= 1 << 16 for c in chunks)
    assert b"".join(c.data for c in chunks) == message.data
    measured = sum(GRPC_FRAME_BYTES + c.ByteSize() for c in chunks)
    assert wire_bytes(message, chunk_bytes=1 << 16) == measured


def test_memoised_wire_bytes_stay_exact_as_headers_vary() -> None:
    """The size memo keys on what changes a header's size: every variant must stay exact."""
    import dataclasses
    import random

    rng = random.Random(7)
    base = _message(64)
    for _ in range(300):
        scalars = {
            rng.choice(["y", "y1", "y12", "restart", "weight"]): rng.choice([0.0, -1.5, 1e300])
            for _ in range(rng.randint(0, 3))
        }
        header = dataclasses.replace(
            base.header,
            sender="agent-" + "7" * rng.randint(1, 12),
            round=rng.choice([0, 1, 127, 128, 2**20, 2**40]),
            seq=rng.choice([0, 1, 300, 2**33]),
            base_seq=rng.choice([0, 5, 2**14]),
            scalars=scalars,
            fleet_digest="d" * rng.choice([0, 16]),
            codec_meta=bytes(rng.choice([0, 8, 300])),
        )
        message = GossipMessage(header, base.data)
        for _ in range(2):  # the second call is served by the memo
            exact = sum(GRPC_FRAME_BYTES + c.ByteSize() for c in to_chunks(message, 16))
            assert wire_bytes(message, chunk_bytes=16) == exact
