"""Sparsifiers: send a fraction of the coordinates, the rest are zero on the other side.

``topk:FRACTION`` keeps the ``k = ceil(FRACTION * n)`` largest magnitudes and sends their
indices; ``randomk:FRACTION`` keeps ``k`` coordinates drawn from a seed and sends only the
seed and the values (the receiver draws the same indices); ``slim:FRACTION:EXPLORE`` sends
the largest magnitudes plus a random explore set (Slim-DP). All are *biased* (a contraction:
``||C(v) - v||**2 <= (1 - k/n) ||v||**2``), meant for algorithms with error feedback
(``choco``, ``quantized-push-sum``), which keep what was not sent and send it later.

Values travel as float32. Wire layouts: top-k, ``k`` int32 indices (strictly increasing)
then ``k`` values; random-k, ``k`` values, with the 8-byte seed as codec metadata; slim, the
top part as top-k then the explore values, with the seed as metadata.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from airgossip.common.seeds import GOLDEN64, splitmix64_array
from airgossip.edge.compression.codec import Codec, DecodeError, Encoded


def kept(numel: int, fraction: float) -> int:
    """Coordinates a sparsifier keeps of ``numel`` (at least one of a non-empty vector)."""
    return min(numel, max(1, math.ceil(fraction * numel))) if numel else 0


class _Sparsifier(Codec):
    unbiased = False
    sparsifier = True
    name = ""

    def __init__(self, fraction: float) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"{self.name} fraction must be within (0, 1], got {fraction}")
        self.fraction = fraction
        self.spec = f"{self.name}:{fraction!r}"

    def _scatter(
        self, numel: int, indices: torch.Tensor, values: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        if not bool(torch.isfinite(values).all()):
            raise DecodeError(f"codec {self.spec}: values hold NaN or infinity")
        out = torch.zeros(numel, dtype=dtype)
        out[indices] = values.to(dtype)
        return out


class TopKCodec(_Sparsifier):
    """The ``k`` largest magnitudes, with their indices."""

    name = "topk"

    def max_bytes(self, numel: int) -> int:
        return 8 * kept(numel, self.fraction)

    def encode(self, vector: torch.Tensor, *, seed: int = 0) -> Encoded:
        flat = vector.detach().reshape(-1).to("cpu")
        n = flat.numel()
        k = kept(n, self.fraction)
        if n == 0:
            return Encoded(self.spec, 0, b"")
        # Ties (many equal magnitudes) resolve to the lowest indices: deterministic bytes.
        order = torch.argsort(flat.abs(), descending=True, stable=True)[:k]
        indices = torch.sort(order).values
        values = flat[indices].to(torch.float32)
        data = indices.to(torch.int32).numpy().astype("<i4").tobytes()
        return Encoded(self.spec, n, data + values.numpy().astype("<f4").tobytes())

    def decode(self, encoded: Encoded, dtype: torch.dtype) -> torch.Tensor:
        self._check_sizes(encoded)
        n = encoded.numel
        k = kept(n, self.fraction)
        if n == 0:
            return torch.zeros(0, dtype=dtype)
        raw = np.frombuffer(encoded.data, dtype=np.uint8)
        indices = raw[: 4 * k].view("<i4").astype(np.int64)
        if indices[0] < 0 or indices[-1] >= n or (k > 1 and bool((np.diff(indices) <= 0).any())):
            raise DecodeError(
                f"codec {self.spec}: indices must be strictly increasing within 0..{n - 1}"
            )
        values = torch.from_numpy(raw[4 * k :].view("<f4").astype(np.float32))
        return self._scatter(n, torch.from_numpy(indices), values, dtype)


def random_indices(seed: int, numel: int, k: int) -> np.ndarray:
    """``k`` distinct sorted indices of ``0..numel-1`` drawn from ``seed``.

    Plain integer arithmetic (no library generator), so a receiver on any machine and any
    numpy or torch version draws exactly the sender's indices.
    """
    with np.errstate(over="ignore"):
        starts = np.uint64(seed) + np.uint64(GOLDEN64) * np.arange(numel, dtype=np.uint64)
    keys = splitmix64_array(starts)
    if k >= numel:
        return np.arange(numel, dtype=np.int64)
    # Distinct keys: the k smallest form one well-defined set whatever the partition method.
    return np.sort(np.argpartition(keys, k - 1)[:k]).astype(np.int64)


class RandomKCodec(_Sparsifier):
    """``k`` coordinates drawn from a seed; only the seed and the values travel."""

    name = "randomk"
    randomised = True

    def max_bytes(self, numel: int) -> int:
        return 4 * kept(numel, self.fraction)

    def meta_bytes(self, numel: int) -> int:
        return 8

    def encode(self, vector: torch.Tensor, *, seed: int = 0) -> Encoded:
        flat = vector.detach().reshape(-1).to("cpu")
        n = flat.numel()
        seed &= (1 << 64) - 1
        indices = torch.from_numpy(random_indices(seed, n, kept(n, self.fraction)))
        values = flat[indices].to(torch.float32).numpy().astype("<f4").tobytes()
        return Encoded(self.spec, n, values, seed.to_bytes(8, "little"))

    def decode(self, encoded: Encoded, dtype: torch.dtype) -> torch.Tensor:
        self._check_sizes(encoded)
        n = encoded.numel
        seed = int.from_bytes(encoded.meta, "little")
        indices = torch.from_numpy(random_indices(seed, n, kept(n, self.fraction)))
        values = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4").astype(np.float32))
        return self._scatter(n, indices, values, dtype)


class SlimCodec(_Sparsifier):
    """Slim-DP's partial exchange: the most significant coordinates plus a random explore set.

    Of the ``k = ceil(FRACTION * n)`` coordinates sent, ``floor(EXPLORE * k)`` are drawn from
    a seed among the coordinates outside the top set (only their values travel, as in
    random-k) and the rest are the largest magnitudes (indices and values, as in top-k).
    ``EXPLORE = 0`` is top-k exactly. The explore set lets coordinates that are never the
    largest still cross now and then (Sun et al., 2017); with error feedback (``choco``,
    ``quantized-push-sum``, ``push-sum``) what is left out goes later either way.

    Wire layout: ``k_top`` int32 indices (strictly increasing), their ``k_top`` float32
    values, the ``k_explore`` float32 explore values; the 8-byte seed is codec metadata.
    """

    name = "slim"
    randomised = True

    def __init__(self, fraction: float, explore: float) -> None:
        super().__init__(fraction)
        if not 0.0 <= explore < 1.0:
            raise ValueError(f"slim explore share must be within [0, 1), got {explore}")
        self.explore = explore
        self.spec = f"slim:{fraction!r}:{explore!r}"

    def split(self, numel: int) -> tuple[int, int]:
        """``(k_top, k_explore)`` for a vector of ``numel`` elements (``k_top >= 1`` if any)."""
        k = kept(numel, self.fraction)
        explore = math.floor(self.explore * k)  # < k, since EXPLORE < 1
        return k - explore, explore

    def max_bytes(self, numel: int) -> int:
        top, explore = self.split(numel)
        return 8 * top + 4 * explore

    def meta_bytes(self, numel: int) -> int:
        return 8

    @staticmethod
    def _explore_indices(seed: int, numel: int, top: np.ndarray, count: int) -> np.ndarray:
        rest = np.ones(numel, dtype=bool)
        rest[top] = False
        others = np.flatnonzero(rest)
        return others[random_indices(seed, others.size, count)] if count else others[:0]

    def encode(self, vector: torch.Tensor, *, seed: int = 0) -> Encoded:
        flat = vector.detach().reshape(-1).to("cpu")
        n = flat.numel()
        seed &= (1 << 64) - 1
        meta = seed.to_bytes(8, "little")
        if n == 0:
            return Encoded(self.spec, 0, b"", meta)
        k_top, k_explore = self.split(n)
        order = torch.argsort(flat.abs(), descending=True, stable=True)[:k_top]
        top = torch.sort(order).values.numpy()
        explore = self._explore_indices(seed, n, top, k_explore)
        values = flat[torch.from_numpy(np.concatenate([top, explore]))].to(torch.float32)
        data = top.astype("<i4").tobytes() + values.numpy().astype("<f4").tobytes()
        return Encoded(self.spec, n, data, meta)

    def decode(self, encoded: Encoded, dtype: torch.dtype) -> torch.Tensor:
        self._check_sizes(encoded)
        n = encoded.numel
        if n == 0:
            return torch.zeros(0, dtype=dtype)
        k_top, k_explore = self.split(n)
        raw = np.frombuffer(encoded.data, dtype=np.uint8)
        top = raw[: 4 * k_top].view("<i4").astype(np.int64)
        if top[0] < 0 or top[-1] >= n or (k_top > 1 and bool((np.diff(top) <= 0).any())):
            raise DecodeError(
                f"codec {self.spec}: indices must be strictly increasing within 0..{n - 1}"
            )
        seed = int.from_bytes(encoded.meta, "little")
        explore = self._explore_indices(seed, n, top, k_explore)
        values = torch.from_numpy(raw[4 * k_top :].view("<f4").astype(np.float32))
        indices = torch.from_numpy(np.concatenate([top, explore]))
        return self._scatter(n, indices, values, dtype)
