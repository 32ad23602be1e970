"""Codecs: flat vectors to bytes and back (raw dtypes; compressors build on this)."""

from edge.compression.codec import CODECS, Codec, DecodeError, Encoded, RawCodec, get_codec

__all__ = ["CODECS", "Codec", "DecodeError", "Encoded", "RawCodec", "get_codec"]
