"""What every benchmark entry hands the runner: one :class:`Outcome` per target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


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


def airgossip_run(config: Path, out: Path) -> dict[str, Any]:
    """``airgossip run --config config --out out`` from this checkout, quietly (a failure
    raises); its ``results.json``."""
    subprocess.run(
        [sys.executable, "-m", "airgossip", "run", "--config", str(config), "--out", str(out)],
        check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results
