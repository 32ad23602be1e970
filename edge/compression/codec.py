"""Codecs turn one flat vector into bytes for the wire and back.

A codec is named by a spec string: a registered name, optionally with one argument after a
colon (``"float32"``, ``"fp16"``, ``"qsgd:4"``, ``"topk:0.01"``). The registry
(:mod:`airgossip.edge.compression.registry`) maps each name to a factory and parses specs; the spec
travels in every message header so the receiver decodes with the sender's codec. This module
holds the contract and the raw codecs; it knows no other codec.

Every codec encodes a vector of ``n`` elements into exactly :meth:`Codec.max_bytes` data
bytes plus :meth:`Codec.meta_bytes` side-information bytes, so a receiver can bound a
message before buffering it and refuse any other size. Decoding checks sizes and contents
before touching memory and never trusts the header alone.

A message may carry several *blocks* (vectors of the same length, each encoded on its own, their
bytes concatenated): :func:`join_blocks`, :func:`encode_blocks`, :func:`decode_blocks`. Stochastic
codecs draw from an explicit ``seed`` (see :func:`airgossip.common.seeds.derive_seed`), never
from global random state, so the same fleet seed gives the same bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from airgossip.common.seeds import derive_seed


class DecodeError(ValueError):
    """An encoded vector that does not decode (wrong size, bad metadata, unknown codec)."""


@dataclass(frozen=True)
class Encoded:
    """One encoded flat vector (or several blocks of equal length, concatenated).

    Attributes
    ----------
    codec:
        Spec of the codec that produced it.
    numel:
        Number of elements of the decoded vector (all blocks together).
    data:
        The encoded buffer (what crosses the wire in chunks).
    meta:
        Small side information (the seed of random-k, ...); empty for most codecs.
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
    #: E[decode(encode(v))] == v: quantization noise averages out (raw codecs, qsgd).
    unbiased: bool = True
    #: Keeps only some coordinates (top-k, random-k): meant for error-feedback algorithms.
    sparsifier: bool = False
    #: Its error is typically smaller than the vector it encodes, so error feedback (send
    #: later what was not sent) shrinks it instead of amplifying it.
    feedback_safe: bool = True
    #: Draws from the seed it is given (qsgd, random-k); deterministic codecs need none.
    randomised: bool = False

    @abstractmethod
    def encode(self, vector: torch.Tensor, *, seed: int = 0) -> Encoded:
        """Encode a flat CPU vector; stochastic codecs draw only from ``seed``."""

    @abstractmethod
    def decode(self, encoded: Encoded, dtype: torch.dtype) -> torch.Tensor:
        """Decode into a new flat vector of ``dtype``; raise :class:`DecodeError` if malformed."""

    @abstractmethod
    def max_bytes(self, numel: int) -> int:
        """Size of ``data`` for a vector of ``numel`` elements (exact; the admission bound)."""

    def meta_bytes(self, numel: int) -> int:
        """Size of ``meta`` for a vector of ``numel`` elements (exact)."""
        return 0

    @property
    def lossless(self) -> bool:
        return False

    def _check_sizes(self, encoded: Encoded) -> None:
        expected = self.max_bytes(encoded.numel)
        if len(encoded.data) != expected:
            raise DecodeError(
                f"codec {self.spec}: {len(encoded.data)} payload bytes for {encoded.numel} "
                f"elements, expected {expected}"
            )
        meta = self.meta_bytes(encoded.numel)
        if len(encoded.meta) != meta:
            raise DecodeError(
                f"codec {self.spec}: {len(encoded.meta)} bytes of codec metadata for "
                f"{encoded.numel} elements, expected {meta}"
            )


RAW_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


class RawCodec(Codec):
    """The vector's elements as little-endian ``dtype`` bytes (a cast when narrower).

    fp16 and bf16 round to nearest: deterministic, slightly biased, half the bytes.
    """

    def __init__(self, spec: str) -> None:
        if spec not in RAW_DTYPES:
            raise ValueError(f"unknown raw codec '{spec}'; choose one of {sorted(RAW_DTYPES)}")
        self.spec = spec
        self.dtype = RAW_DTYPES[spec]
        self.itemsize = torch.empty(0, dtype=self.dtype).element_size()

    @property
    def lossless(self) -> bool:
        return self.dtype in (torch.float64, torch.float32)

    def encode(self, vector: torch.Tensor, *, seed: int = 0) -> Encoded:
        flat = vector.detach().reshape(-1)
        if flat.dtype != self.dtype or not flat.is_cpu or not flat.is_contiguous():
            flat = flat.to(device="cpu", dtype=self.dtype).contiguous()
        # numpy has no bfloat16: its bytes go through a uint8 view.
        array = flat.view(torch.uint8).numpy() if self.dtype == torch.bfloat16 else flat.numpy()
        return Encoded(self.spec, flat.numel(), array.tobytes())

    def decode(self, encoded: Encoded, dtype: torch.dtype) -> torch.Tensor:
        self._check_sizes(encoded)
        if encoded.numel == 0:
            return torch.zeros(0, dtype=dtype)
        buffer = encoded.data if isinstance(encoded.data, bytearray) else bytearray(encoded.data)
        vector = torch.frombuffer(buffer, dtype=self.dtype)
        return vector if dtype == self.dtype else vector.to(dtype)

    def max_bytes(self, numel: int) -> int:
        return numel * self.itemsize


def join_blocks(blocks: Sequence[Encoded]) -> Encoded:
    """Concatenate encoded blocks of one codec into one message buffer."""
    if not blocks:
        raise ValueError("join_blocks needs at least one block")
    specs = {b.codec for b in blocks}
    if len(specs) != 1:
        raise ValueError(f"blocks of different codecs cannot share a message: {sorted(specs)}")
    if len(blocks) == 1:
        return blocks[0]
    return Encoded(
        blocks[0].codec,
        sum(b.numel for b in blocks),
        b"".join(bytes(b.data) for b in blocks),
        b"".join(b.meta for b in blocks),
    )


def encode_blocks(codec: Codec, vector: torch.Tensor, block_numel: int, *, seed: int) -> Encoded:
    """Encode ``vector`` as consecutive blocks of ``block_numel`` elements, each on its own."""
    if block_numel <= 0 or vector.numel() % block_numel:
        raise ValueError(f"{vector.numel()} elements do not split into blocks of {block_numel}")
    count = vector.numel() // block_numel
    if count == 1:
        return codec.encode(vector, seed=seed)
    return join_blocks(
        [
            codec.encode(vector[i * block_numel : (i + 1) * block_numel], seed=derive_seed(seed, i))
            for i in range(count)
        ]
    )


def decode_blocks(
    codec: Codec, encoded: Encoded, block_numel: int, dtype: torch.dtype
) -> torch.Tensor:
    """Decode a buffer of whole blocks of ``block_numel`` elements; :class:`DecodeError` if the
    sizes do not say exactly that."""
    if block_numel <= 0 or encoded.numel % block_numel or encoded.numel == 0:
        if encoded.numel == 0 and block_numel == 0:
            return codec.decode(encoded, dtype)
        raise DecodeError(f"{encoded.numel} elements do not split into blocks of {block_numel}")
    count = encoded.numel // block_numel
    if count == 1:
        return codec.decode(encoded, dtype)
    size, meta = codec.max_bytes(block_numel), codec.meta_bytes(block_numel)
    if len(encoded.data) != count * size or len(encoded.meta) != count * meta:
        raise DecodeError(
            f"codec {codec.spec}: {len(encoded.data)} payload bytes and {len(encoded.meta)} "
            f"metadata bytes for {count} blocks of {block_numel} elements, expected "
            f"{count * size} and {count * meta}"
        )
    data = memoryview(encoded.data).cast("B")
    parts = [
        codec.decode(
            Encoded(
                encoded.codec,
                block_numel,
                bytearray(data[i * size : (i + 1) * size]),
                encoded.meta[i * meta : (i + 1) * meta],
            ),
            dtype,
        )
        for i in range(count)
    ]
    return torch.cat(parts)
