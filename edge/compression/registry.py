"""The codec registry: every codec by name, and the parser of codec specs.

A leaf module: it imports the codecs, and no codec imports it, so adding a codec is one
module and one line in :data:`_REGISTERED`. Each line names a codec, how users write it,
and the factory that builds it from the argument after the colon.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import torch

from edge.compression.codec import RAW_DTYPES, Codec, RawCodec
from edge.compression.quantize import QSGDCodec
from edge.compression.sparsify import RandomKCodec, SlimCodec, TopKCodec

#: Builds a codec from the argument after the colon (None when the spec has none).
CodecFactory = Callable[[str | None], Codec]


def _raw(spec: str) -> CodecFactory:
    def factory(argument: str | None) -> Codec:
        if argument is not None:
            raise ValueError(f"codec '{spec}' takes no argument, got '{spec}:{argument}'")
        return RawCodec(spec)

    return factory


#: (name, how users write it, factory), in the order help texts list them.
_REGISTERED: tuple[tuple[str, str, CodecFactory], ...] = (
    *((spec, spec, _raw(spec)) for spec in RAW_DTYPES),
    ("qsgd", "qsgd:BITS", QSGDCodec.from_argument),
    ("topk", "topk:FRACTION", TopKCodec.from_argument),
    ("randomk", "randomk:FRACTION", RandomKCodec.from_argument),
    ("slim", "slim:FRACTION:EXPLORE", SlimCodec.from_argument),
)

#: Codecs by name; parametrised ones take ``name:ARGUMENT``.
CODECS: dict[str, CodecFactory] = {name: factory for name, _, factory in _REGISTERED}
#: How users write each codec (for help texts and error messages).
CODEC_FORMS: tuple[str, ...] = tuple(form for _, form, _ in _REGISTERED)
assert len(CODECS) == len(_REGISTERED), "two codecs registered under one name"


@lru_cache(maxsize=64)
def get_codec(spec: str) -> Codec:
    """Parse a codec spec (``name`` or ``name:ARGUMENT``); ``ValueError`` naming what is allowed.

    Instances are cached (codecs are stateless), so a receiver may call this per message.
    """
    name, sep, argument = spec.partition(":")
    if name not in CODECS:
        raise ValueError(f"unknown codec '{spec}'; choose one of: {', '.join(CODEC_FORMS)}")
    return CODECS[name](argument if sep else None)


def raw_codec_for(dtype: torch.dtype) -> Codec:
    """The lossless codec of a gossip state's dtype (what ``compression = "none"`` means)."""
    return get_codec("float64" if dtype == torch.float64 else "float32")
