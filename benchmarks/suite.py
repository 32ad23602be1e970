"""What every benchmark entry hands the runner: one :class:`Outcome` per target."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Outcome:
    """One target measured against its baseline in the same run.

    Attributes
    ----------
    target:
        The target's name (``transport``, ``startup``...).
    goal:
        What the target asks, in words (``>= 60% of raw TCP``).
    measured:
        What this run measured, in words, with the baseline's figure beside it.
    met:
        Whether the goal holds; ``None`` when it could not be measured here (``note`` says
        why).
    figures:
        Every number behind ``measured`` (for the JSON).
    note:
        Anything a reader must know to read the row.
    """

    target: str
    goal: str
    measured: str
    met: bool | None
    figures: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Context:
    """What an entry gets: the quick flag, a scratch folder, the venvs' folder."""

    quick: bool
    work: Path
    venvs: Path


def verdict(met: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "not measured"}[met]
