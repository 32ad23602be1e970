"""Fleet figures from the agents' round records: ``results.json`` and the plot."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edge.stats import RoundRecord

ROUND_KEYS = (
    "round",
    "wall_s",
    "mean_accuracy",
    "min_accuracy",
    "max_accuracy",
    "consensus_distance",
    "bytes_sent",
    "messages_sent",
    "messages_dropped",
)


def consensus_distance(estimates: list[np.ndarray]) -> float | None:
    """Mean over agents of ``||z_i - mean z|| / ||mean z||`` (None with no estimates)."""
    if not estimates:
        return None
    stack = np.stack(estimates)
    mean = stack.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    spread = np.linalg.norm(stack - mean, axis=1).mean()
    return float(spread / norm) if norm > 0 else float(spread)


def relative_error(estimates: list[np.ndarray], reference: np.ndarray) -> float | None:
    """Max over agents of ``||z_i - reference|| / ||reference||``."""
    if not estimates:
        return None
    norm = float(np.linalg.norm(reference)) or 1.0
    return float(max(np.linalg.norm(z - reference) for z in estimates) / norm)


def _figures(records: list[RoundRecord], reference: np.ndarray | None) -> dict[str, Any]:
    accuracies = [r.metrics["accuracy"] for r in records if "accuracy" in r.metrics]
    estimates = [r.estimate for r in records if r.estimate is not None]
    row: dict[str, Any] = {
        "wall_s": round(max(r.wall_s for r in records), 4),
        "mean_accuracy": float(np.mean(accuracies)) if accuracies else None,
        "min_accuracy": float(np.min(accuracies)) if accuracies else None,
        "max_accuracy": float(np.max(accuracies)) if accuracies else None,
        "consensus_distance": consensus_distance(estimates),
        "bytes_sent": sum(r.bytes_sent for r in records),
        "messages_sent": sum(r.messages_sent for r in records),
        "messages_dropped": sum(r.messages_dropped + r.messages_failed for r in records),
        "agents_reporting": len(records),
    }
    losses = [r.metrics["loss"] for r in records if "loss" in r.metrics]
    if losses:
        row["mean_loss"] = float(np.mean(losses))
    if reference is not None:
        row["relative_error"] = relative_error(estimates, reference)
    return row


def summarise(
    records: Mapping[str, Iterable[RoundRecord]],
    *,
    reference: np.ndarray | None = None,
) -> dict[str, Any]:
    """Per-round and final fleet figures.

    Parameters
    ----------
    records:
        Every agent's records, by agent id.
    reference:
        The exact answer for pure-gossip tasks (``consensus``): adds ``relative_error``.
    """
    by_round: dict[int, dict[str, RoundRecord]] = {}
    last: dict[str, RoundRecord] = {}
    for agent_id, agent_records in records.items():
        for record in agent_records:
            by_round.setdefault(record.round, {})[agent_id] = record
            if agent_id not in last or record.round >= last[agent_id].round:
                last[agent_id] = record
    rounds = [
        {"round": r, **_figures(list(by_round[r].values()), reference)} for r in sorted(by_round)
    ]
    final = {"round": max((r.round for r in last.values()), default=0)}
    if last:
        final.update(_figures(list(last.values()), reference))
    final["complete"] = bool(last) and all(r.final for r in last.values())
    return {"rounds": rounds, "final": final}


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_results(path: Path, results: dict[str, Any]) -> None:
    path.write_text(json.dumps(_clean(results), indent=2, default=str) + "\n")


def plot_results(path: Path, results: dict[str, Any], title: str) -> None:
    """PNG with accuracy (mean, min-max band) and consensus distance per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rounds"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    if any(r["mean_accuracy"] is not None for r in rows):
        acc = [
            (r["round"], r["mean_accuracy"], r["min_accuracy"], r["max_accuracy"])
            for r in rows
            if r["mean_accuracy"] is not None
        ]
        xs, mean, low, high = (list(c) for c in zip(*acc, strict=True))
        left.fill_between(xs, low, high, alpha=0.25, label="min-max over agents")
        left.plot(xs, mean, label="mean")
        left.set_ylabel("test accuracy")
        left.set_ylim(0, 1)
    else:
        # No accuracy: the error to the exact answer (consensus), else the mean test loss.
        key, label = next(
            ((k, t) for k, t in (("relative_error", "max relative error to the true average"),
                                 ("mean_loss", "mean test loss"))
             if any(r.get(k) is not None for r in rows)),
            (None, ""),
        )  # fmt: skip
        if key is not None:
            points = [(r["round"], r[key]) for r in rows if r.get(key)]
            left.semilogy([p[0] for p in points], [p[1] for p in points], label=label)
            left.set_ylabel(label)
    left.set_xlabel("round")
    if left.get_legend_handles_labels()[0]:
        left.legend(loc="best")
    left.grid(alpha=0.3)
    # A log axis cannot show exact zeros (identical starting models): leave them out.
    dist = [(r["round"], r["consensus_distance"]) for r in rows if r["consensus_distance"]]
    if dist:
        right.semilogy([d[0] for d in dist], [d[1] for d in dist])
    right.set_xlabel("round")
    right.set_ylabel("consensus distance")
    right.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
