"""``qsgd:BITS``: unbiased stochastic quantization to ``2**BITS`` levels per bucket.

The vector is cut into buckets of :data:`QSGD_BUCKET` elements (as in QSGD, Alistarh et
al. 2017); each bucket is scaled by its largest magnitude ``s`` and every element is rounded
at random to one of the ``2**BITS`` evenly spaced levels of ``[-s, s]``, up or down with the
probabilities that make the result unbiased: ``E[decode(encode(v))] = v``. The variance per
element is at most ``(s / (2**BITS - 1))**2``.

Wire layout per vector: one float32 scale per bucket, then the level codes packed
``BITS`` bits each, little-endian. Codes are integers, so any code a sender puts on the wire
decodes to a finite value inside ``[-s, s]``; only the scales need checking.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from airgossip.edge.compression.codec import Codec, DecodeError, Encoded

#: Elements per scale: a float32 scale every 512 elements costs 1/16 bit per element.
QSGD_BUCKET = 512


class QSGDCodec(Codec):
    """Unbiased stochastic rounding to ``2**bits`` levels on ``[-s, s]`` per bucket."""

    unbiased = True
    sparsifier = False
    randomised = True

    def __init__(self, bits: int) -> None:
        if not 1 <= bits <= 8:
            raise ValueError(f"qsgd:BITS needs BITS within 1..8, got {bits}")
        self.bits = bits
        self.intervals = (1 << bits) - 1
        self.spec = f"qsgd:{bits}"
        # Two levels (+-s) put noise of the order of s on every element, far more than the
        # vector's own norm: error feedback then grows the error it should shrink.
        self.feedback_safe = bits >= 2

    def _buckets(self, numel: int) -> int:
        return math.ceil(numel / QSGD_BUCKET)

    def max_bytes(self, numel: int) -> int:
        return 4 * self._buckets(numel) + math.ceil(numel * self.bits / 8)

    def encode(self, vector: torch.Tensor, *, seed: int = 0) -> Encoded:
        flat = vector.detach().reshape(-1).to(device="cpu", dtype=torch.float64).numpy()
        n = flat.size
        if not np.isfinite(flat).all():
            raise ValueError(f"codec {self.spec} cannot encode NaN or infinite values")
        buckets = self._buckets(n)
        padded = np.zeros(buckets * QSGD_BUCKET)
        padded[:n] = flat
        rows = padded.reshape(buckets, QSGD_BUCKET)
        # Round each scale up to a float32 that is >= the largest magnitude, so that every
        # element lies inside [-s, s] once the scale has been narrowed for the wire.
        largest = np.abs(rows).max(axis=1)
        if largest.max(initial=0.0) > np.finfo(np.float32).max:
            raise ValueError(f"codec {self.spec}: values beyond float32 range (a diverged state)")
        scales = largest.astype(np.float32)
        scales = np.where(scales < largest, np.nextafter(scales, np.float32(np.inf)), scales)
        wide = np.maximum(scales.astype(np.float64), np.finfo(np.float64).tiny)
        position = (rows / wide[:, None] + 1.0) * (self.intervals / 2.0)
        noise = np.random.Generator(np.random.PCG64(seed)).random(position.shape)
        codes = np.clip(np.floor(position + noise), 0, self.intervals).astype(np.uint8)
        packed = _pack(codes.reshape(-1)[:n], self.bits)
        return Encoded(self.spec, n, scales.astype("<f4").tobytes() + packed)

    def decode(self, encoded: Encoded, dtype: torch.dtype) -> torch.Tensor:
        self._check_sizes(encoded)
        n = encoded.numel
        if n == 0:
            return torch.zeros(0, dtype=dtype)
        buckets = self._buckets(n)
        raw = np.frombuffer(encoded.data, dtype=np.uint8)
        scales = raw[: 4 * buckets].view("<f4")
        if not np.isfinite(scales).all() or (scales < 0).any():
            raise DecodeError(f"codec {self.spec}: a bucket scale is negative or not finite")
        codes = _unpack(raw[4 * buckets :], self.bits, n)
        # Computed in the target precision, the same way on every machine: a sender that
        # decodes its own message gets exactly the receiver's numbers.
        wide = np.float64 if dtype == torch.float64 else np.float32
        levels = codes.astype(wide) * wide(2.0 / self.intervals) - wide(1.0)
        per_element = np.repeat(scales.astype(wide), QSGD_BUCKET)[:n]
        return torch.from_numpy(per_element * levels).to(dtype)


def _pack(codes: np.ndarray, bits: int) -> bytes:
    """``bits`` low bits of each code, little-endian, concatenated and padded to a byte."""
    codes = codes.astype(np.uint8)
    if bits == 8:
        return codes.tobytes()
    if 8 % bits == 0:  # 1, 2, 4 bits: whole codes per byte, by shifts
        per_byte = 8 // bits
        padded = np.zeros(-(-codes.size // per_byte) * per_byte, dtype=np.uint8)
        padded[: codes.size] = codes
        groups = padded.reshape(-1, per_byte)
        shifts = (np.arange(per_byte) * bits).astype(np.uint8)
        packed: np.ndarray = np.bitwise_or.reduce(groups << shifts, axis=1)
        return packed.astype(np.uint8).tobytes()
    planes = np.unpackbits(codes[:, None], axis=1, bitorder="little")[:, :bits]
    return np.packbits(planes.reshape(-1), bitorder="little").tobytes()


def _unpack(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    if bits == 8:
        return data[:count].astype(np.uint8)
    if 8 % bits == 0:
        per_byte = 8 // bits
        shifts = (np.arange(per_byte) * bits).astype(np.uint8)
        mask = np.uint8((1 << bits) - 1)
        spread: np.ndarray = ((data[:, None] >> shifts) & mask).reshape(-1)[:count]
        return spread
    planes = np.unpackbits(data, bitorder="little", count=count * bits).reshape(count, bits)
    weights = (1 << np.arange(bits)).astype(np.uint8)
    codes: np.ndarray = (planes * weights).sum(axis=1).astype(np.uint8)
    return codes
