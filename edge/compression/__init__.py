"""Codecs: flat vectors to bytes and back (raw dtypes, qsgd quantization, sparsifiers)."""

from edge.compression.codec import (
    Codec,
    DecodeError,
    Encoded,
    RawCodec,
    decode_blocks,
    encode_blocks,
    join_blocks,
)
from edge.compression.quantize import QSGD_BUCKET, QSGDCodec
from edge.compression.registry import CODEC_FORMS, CODECS, get_codec, raw_codec_for
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
    "encode_blocks",
    "get_codec",
    "join_blocks",
    "random_indices",
    "raw_codec_for",
]
