"""Mixing steps per round: what ``mixing_steps = "auto"`` chooses on the peers entry's fleet.

The peers entry's task (8 agent processes over real gRPC, digits, IID shards, the same
learning rate and batch; ``comparison.our_config``) on four configurations, alternated, each
run ``REPEATS`` times (the load of a shared machine changes between runs):

- ``exponential``: the default graph, static: one gossip step a round (what ``auto`` takes);
- ``one-peer-exponential`` at ``auto``: the rule's whole period a round (3 steps on 8
  agents), then what the agents measured and agreed on;
- the one-peer exponential graph at one step a round, and at three (the two counts ``auto``
  chooses between).

Per run: the round reaching 0.90 mean test accuracy, the training time to it
(``train_wall_s``: from the agents' start, start-up excluded), and the bytes a round.

Target: at ``auto`` the one-peer exponential graph reaches 0.90 within 1.2x the time of the
faster of its two fixed counts (medians): the automatic choice is as good as knowing which
to set.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.comparison import our_config
from benchmarks.suite import Context, Outcome, airgossip_run

TARGET = 0.90
#: (name, topology, mixing_steps) of each configuration, in the order they run.
CONFIGS = (
    ("exponential", "exponential", '"auto"'),
    ("one-peer auto", "one-peer-exponential", '"auto"'),
    ("one-peer, 1 step", "one-peer-exponential", "1"),
    ("one-peer, 3 steps", "one-peer-exponential", "3"),
)
REPEATS = 3


def _run(ctx: Context, name: str, topology: str, steps: str, rounds: int, repeat: int
         ) -> dict[str, Any]:  # fmt: skip
    stem = f"{name.replace(' ', '-').replace(',', '')}-{repeat}"
    config = ctx.work / f"{stem}.toml"
    our_config(config, rounds)
    text = config.read_text().replace('topology = "exponential"', f'topology = "{topology}"')
    config.write_text(f"mixing_steps = {steps}\n{text}")
    out = ctx.work / stem
    results = airgossip_run(config, out)
    rows = [r for r in results["rounds"] if r["round"] >= 1]
    hit = next((r for r in rows if (r["mean_accuracy"] or 0.0) >= TARGET), None)
    last = rows[-1]
    return {
        "round": hit["round"] if hit else None,
        "seconds": hit["train_wall_s"] if hit else None,
        "bytes_per_round": last["bytes_sent"] / last["round"],
        "final_accuracy": last["mean_accuracy"],
    }


def _median(values: list[float | None]) -> float | None:
    """The median, a run that never reached the target counting as the worst."""
    if any(v is None for v in values):
        known = [v for v in values if v is not None]
        if len(known) <= len(values) // 2:
            return None
        values = [v if v is not None else float("inf") for v in values]
    return float(statistics.median(v for v in values if v is not None))


def run(ctx: Context) -> list[Outcome]:
    rounds = 15
    repeats = 1 if ctx.quick else REPEATS
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in CONFIGS}
    for repeat in range(repeats):
        for name, topology, steps in CONFIGS:
            runs[name].append(_run(ctx, name, topology, steps, rounds, repeat))
    summary = {
        name: {
            "round": _median([r["round"] for r in rs]),
            "seconds": _median([r["seconds"] for r in rs]),
            "bytes_per_round": statistics.median(r["bytes_per_round"] for r in rs),
        }
        for name, rs in runs.items()
    }
    base, auto = summary["exponential"], summary["one-peer auto"]
    fixed = [summary["one-peer, 1 step"], summary["one-peer, 3 steps"]]
    reached = [f["seconds"] for f in fixed if f["seconds"] is not None]
    met: bool | None = None
    if reached and auto["seconds"] is not None:
        met = auto["seconds"] <= 1.2 * min(reached)

    def said(s: dict[str, Any]) -> str:
        at = "not reached" if s["round"] is None else f"round {s['round']:g}, {s['seconds']:.2f} s"
        return f"{at}, {s['bytes_per_round'] / 1e3:.0f} kB a round"

    return [
        Outcome(
            "mixing",
            "one-peer exponential at auto reaches 0.90 within 1.2x the time of the faster of "
            "its fixed counts (1 step, 3 steps a round)",
            f"auto {said(auto)}; 1 step {said(fixed[0])}; 3 steps {said(fixed[1])}; "
            f"exponential {said(base)} (medians of {repeats})",
            met,
            {"rounds": rounds, "repeats": repeats, "summary": summary, "runs": runs},
        )
    ]
