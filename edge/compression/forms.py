"""How users write a codec (``name`` or ``name:ARGUMENT``) and what each argument may be.

Torch-free on purpose: the settings' validation and the CLI's early check of ``--compression``
read a spec with :func:`parse_codec_spec` before torch is imported, and the registry
(:mod:`airgossip.edge.compression.registry`) builds the codec from what it parsed, so the rules of a
spec live here only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: The raw codecs: a gossip vector's elements in one dtype, taking no argument.
RAW_FORMS: tuple[str, ...] = ("float64", "float32", "fp16", "bf16")


def qsgd_bits(argument: str | None) -> int:
    """The bit width of ``qsgd:BITS``; ``ValueError`` unless within 1..8."""
    if argument is None or not argument.isdigit() or not 1 <= int(argument) <= 8:
        raise ValueError(
            f"codec qsgd needs a bit width: qsgd:BITS with BITS within 1..8, "
            f"got {'qsgd' if argument is None else 'qsgd:' + argument}"
        )
    return int(argument)


def fraction(name: str, argument: str | None) -> float:
    """The fraction of ``name:FRACTION`` (a sparsifier); ``ValueError`` unless in (0, 1]."""
    try:
        value = float(argument) if argument is not None else math.nan
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:
        shown = name if argument is None else f"{name}:{argument}"
        raise ValueError(
            f"codec {name} needs a fraction of coordinates to keep: {name}:FRACTION with "
            f"0 < FRACTION <= 1, got {shown}"
        )
    return value


def slim_arguments(argument: str | None) -> tuple[float, float]:
    """``(FRACTION, EXPLORE)`` of ``slim:FRACTION:EXPLORE``; ``ValueError`` when out of range."""
    parts = argument.split(":") if argument is not None else []
    try:
        share, explore = (float(p) for p in parts) if len(parts) == 2 else (math.nan,) * 2
    except ValueError:
        share = explore = math.nan
    if not (0.0 < share <= 1.0 and 0.0 <= explore < 1.0):
        shown = "slim" if argument is None else f"slim:{argument}"
        raise ValueError(
            "codec slim needs slim:FRACTION:EXPLORE with 0 < FRACTION <= 1 (coordinates sent) "
            f"and 0 <= EXPLORE < 1 (the share of them drawn at random), got {shown}"
        )
    return share, explore


def _no_argument(spec: str) -> Callable[[str | None], None]:
    def parse(argument: str | None) -> None:
        if argument is not None:
            raise ValueError(f"codec '{spec}' takes no argument, got '{spec}:{argument}'")

    return parse


#: (name, how users write it, the parser of its argument), in the order help texts list them.
_FORMS: tuple[tuple[str, str, Callable[[str | None], Any]], ...] = (
    *((spec, spec, _no_argument(spec)) for spec in RAW_FORMS),
    ("qsgd", "qsgd:BITS", qsgd_bits),
    ("topk", "topk:FRACTION", lambda argument: fraction("topk", argument)),
    ("randomk", "randomk:FRACTION", lambda argument: fraction("randomk", argument)),
    ("slim", "slim:FRACTION:EXPLORE", slim_arguments),
)

#: Every codec's name, in the order help texts list them.
CODEC_NAMES: tuple[str, ...] = tuple(name for name, _, _ in _FORMS)
#: How users write each codec (for help texts and error messages).
CODEC_FORMS: tuple[str, ...] = tuple(form for _, form, _ in _FORMS)
_PARSERS = {name: parse for name, _, parse in _FORMS}
assert len(_PARSERS) == len(_FORMS), "two codecs under one name"


def parse_codec_spec(spec: str) -> tuple[str, Any]:
    """``(name, argument)`` of a codec spec, the argument parsed (None for a raw codec);
    ``ValueError`` naming what is allowed."""
    name, sep, argument = spec.partition(":")
    if name not in _PARSERS:
        raise ValueError(f"unknown codec '{spec}'; choose one of: {', '.join(CODEC_FORMS)}")
    return name, _PARSERS[name](argument if sep else None)


def check_compression(value: str) -> str:
    """The ``compression`` setting, checked: ``none`` or a codec spec; ``ValueError`` saying
    what is allowed (the settings' validation and the CLI's early check both ask here)."""
    if value == "none":
        return value
    if value.partition(":")[0] not in _PARSERS:
        raise ValueError(
            f"unknown compression '{value}'; choose one of: none, {', '.join(CODEC_FORMS)}"
        )
    parse_codec_spec(value)
    return value
