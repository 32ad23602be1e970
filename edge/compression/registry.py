"""The codec registry: every codec by name, and the parser of codec specs.

A leaf module: it imports the codecs, and no codec imports it, so adding a codec is one module, its
spec in :mod:`airgossip.edge.compression.forms` (how users write it, what its argument may be:
torch-free, so settings are checked before torch is imported) and one line in
:data:`_BUILDERS` (the class built from the parsed argument), checked complete at import.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch

from airgossip.edge.compression.codec import RAW_DTYPES, Codec, RawCodec
from airgossip.edge.compression.forms import CODEC_FORMS as CODEC_FORMS
from airgossip.edge.compression.forms import CODEC_NAMES, RAW_FORMS, parse_codec_spec
from airgossip.edge.compression.quantize import QSGDCodec
from airgossip.edge.compression.sparsify import RandomKCodec, SlimCodec, TopKCodec

#: Builds a codec from its parsed argument
#: (:func:`~airgossip.edge.compression.forms.parse_codec_spec`).
CodecBuilder = Callable[[Any], Codec]
#: Builds a codec from the argument after the colon (None when the spec has none).
CodecFactory = Callable[[str | None], Codec]


def _raw(spec: str) -> CodecBuilder:
    def build(_: None) -> Codec:
        return RawCodec(spec)

    return build


#: Each codec's class, by the name :mod:`airgossip.edge.compression.forms` gives its spec.
_BUILDERS: dict[str, CodecBuilder] = {
    **{spec: _raw(spec) for spec in RAW_DTYPES},
    "qsgd": QSGDCodec,
    "topk": TopKCodec,
    "randomk": RandomKCodec,
    "slim": lambda arguments: SlimCodec(*arguments),
}
assert tuple(RAW_DTYPES) == RAW_FORMS, "a raw codec without its dtype, or the other way"
assert tuple(_BUILDERS) == CODEC_NAMES, "every codec spec needs its class, and no more"


def _factory(name: str) -> CodecFactory:
    def factory(argument: str | None) -> Codec:
        return get_codec(name if argument is None else f"{name}:{argument}")

    return factory


#: Codecs by name; parametrised ones take ``name:ARGUMENT``.
CODECS: dict[str, CodecFactory] = {name: _factory(name) for name in CODEC_NAMES}


@lru_cache(maxsize=64)
def get_codec(spec: str) -> Codec:
    """Parse a codec spec (``name`` or ``name:ARGUMENT``); ``ValueError`` naming what is allowed.

    Instances are cached (codecs are stateless), so a receiver may call this per message.
    """
    name, argument = parse_codec_spec(spec)
    return _BUILDERS[name](argument)


def raw_codec_for(dtype: torch.dtype) -> Codec:
    """The lossless codec of a gossip state's dtype (what ``compression = "none"`` means)."""
    return get_codec("float64" if dtype == torch.float64 else "float32")
