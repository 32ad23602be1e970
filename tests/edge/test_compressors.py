"""Compressors: exact sizes, unbiasedness, determinism, strict decoding, the registry."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from airgossip.edge.compression import (
    QSGD_BUCKET,
    DecodeError,
    Encoded,
    decode_blocks,
    encode_blocks,
    get_codec,
    join_blocks,
    random_indices,
)
from airgossip.edge.compression.quantize import _pack, _unpack

SIZES = [1, 7, 511, 512, 513, 2410]


def vector(numel: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("numel", SIZES)
def test_qsgd_size_range_and_levels(bits: int, numel: int) -> None:
    codec = get_codec(f"qsgd:{bits}")
    v = vector(numel, bits)
    encoded = codec.encode(v, seed=1)
    buckets = math.ceil(numel / QSGD_BUCKET)
    assert len(encoded.data) == codec.max_bytes(numel) == 4 * buckets + math.ceil(numel * bits / 8)
    decoded = codec.decode(encoded, torch.float64)
    intervals = 2**bits - 1
    for b in range(buckets):
        part = slice(b * QSGD_BUCKET, (b + 1) * QSGD_BUCKET)
        scale = float(v[part].abs().max())
        assert float(decoded[part].abs().max()) <= scale * (1 + 1e-6)  # never outside [-s, s]
        # every value sits on the grid s * (2c / L - 1), one step from the input at most
        assert float((decoded[part] - v[part]).abs().max()) <= 2 * scale / intervals * (1 + 1e-6)


def test_qsgd_is_unbiased_and_its_variance_shrinks_with_bits() -> None:
    v = vector(1000, 3)
    errors = {}
    for bits in (2, 4, 8):
        codec = get_codec(f"qsgd:{bits}")
        draws = [codec.decode(codec.encode(v, seed=s), torch.float64) for s in range(400)]
        samples = torch.stack(draws)
        bias = (samples.mean(0) - v).abs().max()
        spread = float((samples - v).pow(2).sum(1).mean() / v.pow(2).sum())
        scale = float(v.abs().max())
        # the mean of 400 draws is within 5 standard errors of the input everywhere
        assert float(bias) < 5 * (2 * scale / (2**bits - 1)) / math.sqrt(400)
        errors[bits] = spread
    assert errors[2] > 10 * errors[4] > 100 * errors[8] > 0


def test_qsgd_is_deterministic_for_a_seed() -> None:
    codec, v = get_codec("qsgd:3"), vector(2000)
    assert codec.encode(v, seed=5).data == codec.encode(v, seed=5).data
    assert codec.encode(v, seed=5).data != codec.encode(v, seed=6).data


def test_qsgd_decodes_the_same_in_either_precision_of_the_wire() -> None:
    codec, v = get_codec("qsgd:4"), vector(900)
    encoded = codec.encode(v, seed=2)
    wide, narrow = codec.decode(encoded, torch.float64), codec.decode(encoded, torch.float32)
    assert narrow.dtype == torch.float32
    torch.testing.assert_close(narrow.double(), wide, rtol=1e-6, atol=1e-6)


def test_qsgd_refuses_bad_scales_and_values_it_cannot_encode() -> None:
    codec = get_codec("qsgd:4")
    good = codec.encode(vector(10), seed=0)
    for bad_scale in (float("nan"), float("inf"), -1.0):
        data = np.float32(bad_scale).tobytes() + bytes(good.data)[4:]
        with pytest.raises(DecodeError, match="scale is negative or not finite"):
            codec.decode(Encoded("qsgd:4", 10, data), torch.float32)
    with pytest.raises(DecodeError, match="10 payload bytes for 10 elements, expected 9"):
        codec.decode(Encoded("qsgd:4", 10, bytes(good.data)[:-1] + b"\0\0"), torch.float32)
    with pytest.raises(ValueError, match="NaN or infinite"):
        codec.encode(torch.tensor([1.0, float("nan")]))


@pytest.mark.parametrize("bits", range(1, 8))
def test_bit_packing_round_trips(bits: int) -> None:
    codes = np.random.default_rng(bits).integers(0, 2**bits, 1001).astype(np.uint8)
    packed = np.frombuffer(_pack(codes, bits), dtype=np.uint8)
    assert packed.size == math.ceil(1001 * bits / 8)
    assert (_unpack(packed, bits, 1001) == codes).all()


@pytest.mark.parametrize("numel", SIZES)
def test_topk_keeps_the_largest_magnitudes(numel: int) -> None:
    codec = get_codec("topk:0.1")
    v = vector(numel, 4)
    encoded = codec.encode(v)
    k = max(1, math.ceil(0.1 * numel))
    assert len(encoded.data) == codec.max_bytes(numel) == 8 * k
    decoded = codec.decode(encoded, torch.float64)
    kept = decoded != 0
    assert int(kept.sum()) == k
    assert float(torch.cat([v[~kept].abs(), torch.zeros(1)]).max()) <= float(v[kept].abs().min())
    torch.testing.assert_close(decoded[kept], v[kept].float().double())


def test_topk_refuses_indices_that_do_not_fit() -> None:
    codec = get_codec("topk:0.5")  # 2 of 4 elements
    values = np.array([1.0, 2.0], dtype="<f4").tobytes()
    for indices in ([1, 1], [2, 1], [-1, 2], [0, 4]):
        data = np.array(indices, dtype="<i4").tobytes() + values
        with pytest.raises(DecodeError, match=r"strictly increasing within 0\.\.3"):
            codec.decode(Encoded("topk:0.5", 4, data), torch.float32)
    nan = np.array([0, 1], dtype="<i4").tobytes() + np.array([1, np.nan], dtype="<f4").tobytes()
    with pytest.raises(DecodeError, match="NaN or infinity"):
        codec.decode(Encoded("topk:0.5", 4, nan), torch.float32)


def test_randomk_sends_values_and_a_seed_and_the_receiver_draws_the_same_indices() -> None:
    codec = get_codec("randomk:0.25")
    v = vector(1000, 7)
    encoded = codec.encode(v, seed=123)
    assert len(encoded.data) == codec.max_bytes(1000) == 4 * 250
    assert len(encoded.meta) == codec.meta_bytes(1000) == 8
    decoded = codec.decode(encoded, torch.float64)
    indices = torch.from_numpy(random_indices(123, 1000, 250))
    assert torch.equal(torch.nonzero(decoded).flatten(), indices)
    torch.testing.assert_close(decoded[indices], v[indices].float().double())
    other = random_indices(124, 1000, 250)
    assert len(set(indices.tolist()) & set(other.tolist())) < 125  # another seed, other picks
    with pytest.raises(DecodeError, match="metadata"):
        codec.decode(Encoded(encoded.codec, 1000, encoded.data, b"\0" * 4), torch.float32)


def test_random_indices_are_plain_arithmetic() -> None:
    """Fixed values: any change to the draw would break senders and receivers of different
    versions that must agree on the indices."""
    assert random_indices(0, 10, 3).tolist() == random_indices(0, 10, 3).tolist()
    picks = random_indices(42, 100_000, 1000)
    assert picks.size == 1000 and len(set(picks.tolist())) == 1000
    assert np.all(np.diff(picks) > 0) and picks[0] >= 0 and picks[-1] < 100_000
    # roughly uniform: each tenth of the range gets its share
    counts = np.bincount(picks // 10_000, minlength=10)
    assert counts.min() > 60 and counts.max() < 140


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("zstd", "unknown codec 'zstd'; choose one of: float64, float32, fp16, bf16, qsgd:BITS"),
        ("qsgd", "qsgd needs a bit width: qsgd:BITS with BITS within 1..8, got qsgd"),
        ("qsgd:9", "BITS within 1..8, got qsgd:9"),
        ("qsgd:0", "BITS within 1..8, got qsgd:0"),
        ("qsgd:four", "got qsgd:four"),
        ("topk", "topk:FRACTION with 0 < FRACTION <= 1, got topk"),
        ("topk:0", "got topk:0"),
        ("topk:1.5", "got topk:1.5"),
        ("randomk:nan", "got randomk:nan"),
        ("fp16:2", "codec 'fp16' takes no argument"),
    ],
)
def test_bad_specs_say_what_is_allowed(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        get_codec(spec)


def test_specs_are_canonical_and_codecs_shared() -> None:
    assert get_codec("topk:1e-2").spec == "topk:0.01"
    assert get_codec("qsgd:04").spec == "qsgd:4"
    assert get_codec("qsgd:4") is get_codec("qsgd:4")
    assert not get_codec("qsgd:1").feedback_safe and get_codec("qsgd:2").feedback_safe
    assert get_codec("topk:0.1").sparsifier and not get_codec("topk:0.1").unbiased


@pytest.mark.parametrize("spec", ["float32", "fp16", "qsgd:4", "topk:0.1", "randomk:0.1"])
def test_blocks_are_encoded_on_their_own_and_split_back(spec: str) -> None:
    codec = get_codec(spec)
    a, b = vector(600, 1), vector(600, 2) * 100  # very different scales
    joined = encode_blocks(codec, torch.cat([a, b]), 600, seed=9)
    assert len(joined.data) == 2 * codec.max_bytes(600)
    decoded = decode_blocks(codec, joined, 600, torch.float64)
    each = join_blocks([codec.encode(a, seed=0), codec.encode(b, seed=0)])
    assert len(each.data) == len(joined.data)
    if codec.lossless or spec == "fp16":
        torch.testing.assert_close(decoded, torch.cat([a, b]), rtol=1e-3, atol=1e-3)
    else:  # each block kept its own scale or its own top entries
        assert float(decoded[:600].abs().max()) < 10 and float(decoded[600:].abs().max()) > 10
    with pytest.raises(DecodeError, match="blocks of 600"):
        decode_blocks(codec, Encoded(spec, 1200, bytes(joined.data)[:-1], joined.meta), 600,
                      torch.float64)  # fmt: skip
    with pytest.raises(DecodeError, match="do not split into blocks"):
        decode_blocks(codec, Encoded(spec, 1100, joined.data, joined.meta), 600, torch.float64)
