"""``slim:FRACTION:EXPLORE`` (Slim-DP's partial exchange): exact sizes, the top set, a seeded
explore set the receiver redraws, strict decoding, error feedback through choco."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from airgossip.edge.algorithms import create_algorithm
from airgossip.edge.algorithms.shared_copy import default_gamma
from airgossip.edge.compression import DecodeError, Encoded, SlimCodec, get_codec
from tests.support.lossy import AlgorithmFleet

SIZES = [1, 2, 7, 100, 513, 2410]


def vector(numel: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("spec", ["slim:0.1:0.5", "slim:0.3:0.25", "slim:1:0.9"])
def test_slim_sends_the_top_set_and_an_explore_set_in_exact_bytes(spec: str, numel: int) -> None:
    codec = get_codec(spec)
    assert isinstance(codec, SlimCodec)
    v = vector(numel, 4)
    encoded = codec.encode(v, seed=77)
    k = max(1, math.ceil(codec.fraction * numel))
    k_explore = math.floor(codec.explore * k)
    k_top = k - k_explore
    assert codec.split(numel) == (k_top, k_explore) and k_top >= 1
    assert len(encoded.data) == codec.max_bytes(numel) == 8 * k_top + 4 * k_explore
    assert len(encoded.meta) == codec.meta_bytes(numel) == 8
    decoded = codec.decode(encoded, torch.float64)
    sent = decoded != 0
    assert int(sent.sum()) == k  # random draws never land on a top coordinate
    top_indices = np.frombuffer(bytes(encoded.data)[: 4 * k_top], dtype="<i4").astype(np.int64)
    top = torch.from_numpy(top_indices)
    rest = torch.from_numpy(np.setdiff1d(np.arange(numel), top_indices))
    # the top part holds the largest magnitudes ...
    if rest.numel():
        assert float(v[rest].abs().max()) <= float(v[top].abs().min())
    # ... and every sent value is the input's, in float32
    torch.testing.assert_close(decoded[sent], v[sent].float().double())


def test_the_explore_set_follows_the_seed_and_explore_zero_is_top_k() -> None:
    codec, v = get_codec("slim:0.1:0.5"), vector(1000, 1)
    a, b = codec.encode(v, seed=1), codec.encode(v, seed=2)
    assert a.data[: 4 * 50] == b.data[: 4 * 50]  # the same top half
    picked = {
        seed: set(torch.nonzero(codec.decode(e, torch.float64)).flatten().tolist())
        for seed, e in ((1, a), (2, b))
    }
    assert len(picked[1] ^ picked[2]) > 50  # other explore coordinates for another seed
    assert codec.encode(v, seed=1).data == a.data  # deterministic for a seed
    slim, topk = get_codec("slim:0.1:0"), get_codec("topk:0.1")
    torch.testing.assert_close(
        slim.decode(slim.encode(v, seed=9), torch.float64),
        topk.decode(topk.encode(v), torch.float64),
    )
    assert slim.max_bytes(1000) == topk.max_bytes(1000)


def test_slim_refuses_what_does_not_decode() -> None:
    codec = get_codec("slim:0.5:0.5")  # 4 elements: one top, one explore
    assert codec.split(4) == (1, 1)
    seed = (5).to_bytes(8, "little")
    good = codec.encode(torch.tensor([0.1, 3.0, -0.2, 0.4]), seed=5)
    assert good.meta == seed
    for index in (-1, 4, 1 << 30):
        data = np.array([index], "<i4").tobytes() + bytes(good.data)[4:]
        with pytest.raises(DecodeError, match=r"strictly increasing within 0\.\.3"):
            codec.decode(Encoded(codec.spec, 4, data, seed), torch.float32)
    nan = bytes(good.data)[:8] + np.array([np.nan], "<f4").tobytes()
    with pytest.raises(DecodeError, match="NaN or infinity"):
        codec.decode(Encoded(codec.spec, 4, nan, seed), torch.float32)
    with pytest.raises(DecodeError, match="expected 12"):
        codec.decode(Encoded(codec.spec, 4, bytes(good.data) + b"\0", seed), torch.float32)
    with pytest.raises(DecodeError, match="metadata"):
        codec.decode(Encoded(codec.spec, 4, good.data, b""), torch.float32)
    widest = codec.encode(torch.arange(1.0, 1001.0, dtype=torch.float64), seed=(1 << 64) - 1)
    assert int(codec.decode(widest, torch.float32).count_nonzero()) == 500  # any 64-bit seed


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("slim", "slim:FRACTION:EXPLORE with 0 < FRACTION <= 1"),
        ("slim:0.1", "got slim:0.1"),
        ("slim:0:0.5", "got slim:0:0.5"),
        ("slim:0.1:1", "0 <= EXPLORE < 1"),
        ("slim:0.1:-0.1", "got slim:0.1:-0.1"),
        ("slim:0.1:0.2:3", "got slim:0.1:0.2:3"),
        ("slim:a:b", "got slim:a:b"),
    ],
)
def test_bad_slim_specs_say_what_is_allowed(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_codec(spec)


def test_slim_is_a_canonical_registered_sparsifier() -> None:
    codec = get_codec("slim:1e-2:0.50")
    assert codec.spec == "slim:0.01:0.5"
    assert get_codec(codec.spec) is get_codec("slim:0.01:0.5")  # one shared instance
    assert codec.sparsifier and codec.randomised and codec.feedback_safe
    assert default_gamma(codec) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="dpsgd sends whole models"):
        create_algorithm("dpsgd", torch.zeros(3), dtype=torch.float32, codec=codec)


def test_choco_with_slim_is_exact_under_a_hostile_network() -> None:
    """Error feedback: what slim leaves out stays in the copy's difference and goes later."""
    fleet = AlgorithmFleet.build(
        "choco", 6, topology="ring", compression="slim:0.3:0.5", seed=3, options={"gamma": 0.3}
    )
    target, total = fleet.average(), fleet.total_x()
    fleet.run(150, seed=4, loss=0.2, duplicate=0.2, max_delay=3, ack_loss=0.3)
    fleet.run(300)
    torch.testing.assert_close(fleet.total_x(), total, rtol=0, atol=1e-10)
    assert fleet.error(target) < 1e-10
