"""Scale: many agents in one process, each row a process of its own (its peak PSS its own).

Rows (the targets of issue 18):

* 1,000 agents x 100 rounds, lte-urban, consensus, virtual clock: < 15 s and < 2 GB;
* 10,000 agents x 20 rounds, lte-urban (the channel model over the links in range): < 3 min
  and < 8 GB; and the same over an area scaled to lte-urban's density at 1,000: reported;
* 100,000 agents x 10 rounds, consensus on a static lossy graph (no channel model, the
  lock-step in-process driver): < 10 min and < 16 GB;
* 100,000 agents x 10 rounds, lte-urban with its area scaled to keep its density: reported;
* 1,000 agents x 40 rounds learning digits on the virtual clock: < 3 min, mean accuracy
  >= 0.9 (lte-urban with ``benchmarks/configs/digits-fleet.toml``: digits has under two
  training images an agent at 1,000 agents, see that file and docs/performance.md).

The 1,000-agent lte-urban row also runs the lock-step driver on the same gossip graph (no
link model) for a cost per message measured in the same process; the 10,000-agent rows do
not (a lock-step round of 10,000 agents costs about 15 s of CPU; its mixing weights are
sparse above 1,024 agents, so no longer a 10,000 x 10,000 eigendecomposition). A row that
runs past twice its time goal (an hour for the reported one) is stopped and reported as not
finished.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.proctree import run_watched
from benchmarks.suite import Context, Outcome

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Row:
    name: str
    goal: str
    args: tuple[str, ...]
    seconds: float | None  # None: reported, no goal
    gib: float | None
    accuracy: float | None = None


def _rows(quick: bool) -> list[Row]:
    lte = ("--scenario", "lte-urban")
    if quick:
        return [Row("scale 1,000 x 20", "1,000 agents x 20 rounds: < 6 s and < 2 GB",
                    ("--agents", "1000", "--rounds", "20", "--baseline-rounds", "3", *lte),
                    6.0, 2.0)]  # fmt: skip
    return [
        Row("scale 1,000", "1,000 agents x 100 rounds, lte-urban: < 15 s and < 2 GB",
            ("--agents", "1000", "--rounds", "100", "--baseline-rounds", "3", *lte), 15.0, 2.0),
        Row("scale 10,000", "10,000 agents x 20 rounds, lte-urban: < 3 min and < 8 GB",
            ("--agents", "10000", "--rounds", "20", "--baseline-rounds", "0", *lte), 180.0, 8.0),
        Row("scale 10,000 at its density", "10,000 agents x 20 rounds, lte-urban over a 6.3 km "
            "square (its density at 1,000): reported", ("--agents", "10000", "--rounds", "20",
            "--baseline-rounds", "0", "--area-scale", "3.1623", *lte), None, None),
        Row("scale 100,000 static", "100,000 agents x 10 rounds, consensus, static lossy "
            "graph: < 10 min and < 16 GB", ("--agents", "100000", "--rounds", "10",
            "--network", "static", "--topology", "exponential", "--loss", "0.05"), 600.0, 16.0),
        Row("scale 100,000 wireless", "100,000 agents x 10 rounds, lte-urban over a 20 km "
            "square (its density): reported", ("--agents", "100000", "--rounds", "10",
            "--baseline-rounds", "0", "--area-scale", "10", *lte), None, None),
        Row("scale digits 1,000", "1,000 agents x 40 rounds, digits, virtual clock, lte-urban "
            "with benchmarks/configs/digits-fleet.toml (50 images an agent drawn from the "
            "pool, 3 local steps of lr 0.5, rounds waiting up to 10 s for their sends, test "
            "every 10 rounds): < 3 min, mean accuracy >= 0.9", ("--agents", "1000", "--rounds",
            "40", "--task", "digits", "--baseline-rounds", "0", "--config",
            "benchmarks/configs/digits-fleet.toml", *lte), 180.0, None, 0.9),
    ]  # fmt: skip


def _one(ctx: Context, row: Row) -> Outcome:
    slug = row.name.replace(" ", "-").replace(",", "")
    out, log = ctx.work / f"{slug}.json", ctx.work / f"{slug}.log"
    # Long enough that a row missing its goal still gets its figure (a quick row of a few
    # seconds that takes a minute reports that minute), short enough to end the entry.
    timeout = max(4 * row.seconds, 180.0) if row.seconds is not None else 3600.0
    try:
        cost = run_watched(
            [sys.executable, str(ROOT / "benchmarks" / "virtual_clock.py"), *row.args,
             "--json", str(out)],
            log_path=log, cwd=ROOT, isolate_network=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout_s=timeout, interval_s=0.5,
        )  # fmt: skip
    except TimeoutError:
        # One run that does not finish must not cost the other rows.
        return Outcome(row.name, row.goal, f"not finished in {timeout:.0f} s (log {log})",
                       False, {"timeout_s": timeout})  # fmt: skip
    if cost.returncode != 0:
        return Outcome(row.name, row.goal, f"failed (exit {cost.returncode}, log {log})", False,
                       {"returncode": cost.returncode})  # fmt: skip
    figures: dict[str, Any] = json.loads(out.read_text())
    figures.update(peak_pss_bytes=cost.peak_pss_bytes, process_wall_s=round(cost.wall_s, 1))
    wall = figures["wall_s"]
    met = row.seconds is None or wall < row.seconds
    met = met and (row.gib is None or cost.peak_pss_bytes < row.gib * 1e9)
    measured = (
        f"{wall:.1f} s wall ({figures['cpu_s']:.1f} s CPU), peak PSS "
        f"{cost.peak_pss_bytes / 1e9:.2f} GB; {figures['messages']:,} messages, "
        f"{figures['us_cpu_per_message']:.0f} us CPU per message"
    )
    if "baseline_us_cpu_per_message" in figures:
        measured += (f" vs lock-step {figures['baseline_us_cpu_per_message']:.0f} us "
                     f"({figures['ratio_to_lockstep']:.2f}x)")  # fmt: skip
    if figures.get("relative_error") is not None:
        measured += f"; relative error {figures['relative_error']:.2e}"
    if row.accuracy is not None:
        accuracy = figures.get("mean_accuracy")
        measured += f"; mean accuracy {accuracy:.4f}" if accuracy is not None else "; no accuracy"
        met = met and accuracy is not None and accuracy >= row.accuracy
    return Outcome(row.name, row.goal, measured, met if row.seconds is not None else None,
                   figures)  # fmt: skip


def run(ctx: Context) -> list[Outcome]:
    return [_one(ctx, row) for row in _rows(ctx.quick)]
