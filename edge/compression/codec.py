"""Codecs turn one flat vector into bytes for the wire and back.

A codec is looked up by its spec string (``"float32"``, ``"fp16"``, ...) in :data:`CODECS`;
the spec travels in every message header so the receiver decodes with the sender's codec.
Decoding checks sizes before touching memory and never trusts the header alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch


class DecodeError(ValueError):
    """An encoded vector that does not decode (wrong size, bad metadata, unknown codec)."""


@dataclass(frozen=True)
class Encoded:
    """One encoded flat vector.

    Attributes
    ----------
    codec:
        Spec of the codec that produced it.
    numel:
        Number of elements of the decoded vector.
    data:
        The encoded buffer (what crosses the wire in chunks).
    meta:
        Small side information (scales, seeds); empty for raw codecs.
    """

    codec: str
    numel: int
    data: bytes | bytearray | memoryview
    meta: bytes = b""

    @property
    def nbytes(self) -> int:
        return len(self.data) + len(self.meta)


class Codec(ABC):
    """Encodes flat vectors; stateless, so one instance can serve every edge."""

    spec: str

    @abstractmethod
    def encode(self, vector: torch.Tensor) -> Encoded:
        """Encode a flat CPU vector."""

    @abstractmethod
    def decode(self, encoded: Encoded, dtype: torch.dtype) -> torch.Tensor:
        """Decode into a new flat vector of ``dtype``; raise :class:`DecodeError` if malformed."""

    @abstractmethod
    def max_bytes(self, numel: int) -> int:
        """Upper bound of ``len(data)`` for a vector of ``numel`` elements (admission check)."""

    @property
    def lossless(self) -> bool:
        return False


_RAW_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


class RawCodec(Codec):
    """The vector's elements as little-endian ``dtype`` bytes (a cast when narrower)."""

    def __init__(self, spec: str) -> None:
        if spec not in _RAW_DTYPES:
            raise ValueError(f"unknown raw codec '{spec}'; choose one of {sorted(_RAW_DTYPES)}")
        self.spec = spec
        self.dtype = _RAW_DTYPES[spec]
        self.itemsize = torch.empty(0, dtype=self.dtype).element_size()

    @property
    def lossless(self) -> bool:
        return self.dtype in (torch.float64, torch.float32)

    def encode(self, vector: torch.Tensor) -> Encoded:
        flat = vector.detach().reshape(-1).to(device="cpu", dtype=self.dtype).contiguous()
        data = flat.view(torch.uint8).numpy().tobytes()
        return Encoded(self.spec, flat.numel(), data)

    def decode(self, encoded: Encoded, dtype: torch.dtype) -> torch.Tensor:
        expected = encoded.numel * self.itemsize
        if len(encoded.data) != expected:
            raise DecodeError(
                f"codec {self.spec}: {len(encoded.data)} payload bytes for {encoded.numel} "
                f"elements, expected {expected}"
            )
        if encoded.numel == 0:
            return torch.zeros(0, dtype=dtype)
        buffer = encoded.data if isinstance(encoded.data, bytearray) else bytearray(encoded.data)
        return torch.frombuffer(buffer, dtype=self.dtype).to(dtype)

    def max_bytes(self, numel: int) -> int:
        return numel * self.itemsize


def _raw(spec: str) -> Callable[[], Codec]:
    return lambda: RawCodec(spec)


CODECS: dict[str, Callable[[], Codec]] = {spec: _raw(spec) for spec in _RAW_DTYPES}


def get_codec(spec: str) -> Codec:
    """Look up a codec by spec; raise ``ValueError`` naming the allowed ones."""
    if spec not in CODECS:
        raise ValueError(f"unknown codec '{spec}'; choose one of: {', '.join(sorted(CODECS))}")
    return CODECS[spec]()
