"""Codecs: flat vectors to bytes and back (raw dtypes, qsgd quantization, sparsifiers).

The names below are loaded on first use (PEP 562): :mod:`airgossip.edge.compression.forms`, the
torch-free grammar of codec specs, is imported by checks that run before torch is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airgossip.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from airgossip.edge.compression.codec import (
        Codec,
        DecodeError,
        Encoded,
        RawCodec,
        decode_blocks,
        encode_blocks,
        join_blocks,
    )
    from airgossip.edge.compression.forms import CODEC_FORMS
    from airgossip.edge.compression.quantize import QSGD_BUCKET, QSGDCodec
    from airgossip.edge.compression.registry import CODECS, get_codec, raw_codec_for
    from airgossip.edge.compression.sparsify import (
        RandomKCodec,
        SlimCodec,
        TopKCodec,
        random_indices,
    )

#: Each public name and the module that defines it.
_HOMES = {
    **dict.fromkeys(
        ["Codec", "DecodeError", "Encoded", "RawCodec", "decode_blocks", "encode_blocks",
         "join_blocks"], "airgossip.edge.compression.codec"),
    **dict.fromkeys(["QSGD_BUCKET", "QSGDCodec"], "airgossip.edge.compression.quantize"),
    "CODEC_FORMS": "airgossip.edge.compression.forms",  # torch-free: help texts read it
    **dict.fromkeys(["CODECS", "get_codec", "raw_codec_for"],
                    "airgossip.edge.compression.registry"),
    **dict.fromkeys(["RandomKCodec", "SlimCodec", "TopKCodec", "random_indices"],
                    "airgossip.edge.compression.sparsify"),
}  # fmt: skip


__getattr__ = lazy_exports(__name__, _HOMES)


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
