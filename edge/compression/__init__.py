"""Codecs: flat vectors to bytes and back (raw dtypes, qsgd quantization, sparsifiers)."""

from edge.compression.codec import (
    CODEC_FORMS,
    CODECS,
    Codec,
    DecodeError,
    Encoded,
    RawCodec,
    decode_blocks,
    derive_seed,
    encode_blocks,
    get_codec,
    join_blocks,
    raw_codec_for,
)
from edge.compression.quantize import QSGD_BUCKET, QSGDCodec
from edge.compression.sparsify import RandomKCodec, SlimCodec, TopKCodec, random_indices

__all__ = [
    "CODECS",
    "CODEC_FORMS",
    "QSGD_BUCKET",
    "Codec",
    "DecodeError",
    "Encoded",
    "QSGDCodec",
    "RandomKCodec",
    "RawCodec",
    "SlimCodec",
    "TopKCodec",
    "decode_blocks",
    "derive_seed",
    "encode_blocks",
    "get_codec",
    "join_blocks",
    "random_indices",
    "raw_codec_for",
]
