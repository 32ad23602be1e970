"""Algorithms x topology x compression x loss on seeded in-process fleets: a markdown table.

Run from the repository root (a few minutes on 2 cores)::

    python -m benchmarks.algorithms                 # the full grid, markdown on stdout
    python -m benchmarks.algorithms --only choco    # rows whose algorithm contains "choco"
    python -m benchmarks.algorithms --out docs/algorithms-table.md

Learning rows: digits, 16 agents, strongly non-IID (Dirichlet alpha 0.1), 80 rounds of 10
local SGD steps. For each row: final mean (and worst agent's) test accuracy, consensus
distance, megabytes on the wire, bytes relative to the baseline row (push-sum, exponential,
no compression, 10% loss) measured in the same run, and the megabytes and rounds it took the
fleet's mean accuracy to first reach the target. Consensus rows: the exact-average probe,
8 agents, 120 rounds, relative error to the true average. Every figure comes from the run
that prints it; nothing is copied in.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from airgossip.emulation.fleets import preflight, reference_answer
from airgossip.emulation.fleets.inproc import run_in_process
from airgossip.scenario.config import load_config
from airgossip.scenario.results import summarise


@dataclass(frozen=True)
class Row:
    algorithm: str
    topology: str
    compression: str = "none"
    loss: float = 0.1
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.algorithm} ({extra})" if extra else self.algorithm


BASELINE = Row("push-sum", "exponential")

LEARNING = [
    BASELINE,
    Row("push-sum", "exponential", loss=0.0),
    Row("push-sum", "exponential", loss=0.3),
    Row("push-sum-plain", "exponential"),
    Row("push-sum", "complete"),
    Row("push-sum", "one-peer-exponential"),
    Row("push-sum", "ring"),
    Row("push-sum", "exponential", "qsgd:4"),
    Row("quantized-push-sum", "exponential"),
    Row("quantized-push-sum", "exponential", "qsgd:4"),
    Row("quantized-push-sum", "exponential", "qsgd:2"),
    Row("quantized-push-sum", "exponential", "topk:0.1"),
    Row("gradient-tracking", "exponential"),
    Row("gradient-tracking", "ring"),
    Row("dpsgd", "ring"),
    Row("choco", "ring"),
    Row("choco", "ring", "topk:0.01"),
    Row("choco", "ring", "randomk:0.05"),
    Row("local-sgd", "complete", options={"period": 4}),
    Row("local-sgd", "exponential", options={"period": 4}),
]

CONSENSUS = [
    Row(algorithm, topology, compression, loss, options)
    for algorithm, topology, compression, options in [
        ("push-sum", "exponential", "none", {}),
        ("push-sum-plain", "exponential", "none", {}),
        ("push-sum-plain", "exponential", "qsgd:4", {}),
        ("push-sum", "exponential", "qsgd:4", {}),
        ("quantized-push-sum", "exponential", "qsgd:4", {}),
        ("quantized-push-sum", "exponential", "qsgd:2", {"gamma": 0.5}),
        ("dpsgd", "ring", "none", {}),
        ("choco", "ring", "qsgd:4", {}),
        ("gradient-tracking", "exponential", "none", {}),
    ]
    for loss in (0.0, 0.3)
]


def run(row: Row, settings: dict[str, Any]) -> dict[str, Any]:
    """One seeded in-process fleet; its round-by-round and final figures."""
    config = load_config(None, {
        **settings, "mode": "inproc", "algorithm": row.algorithm, "topology": row.topology,
        "compression": row.compression, "algorithm_options": row.options,
        "network": {"loss": row.loss},
    })  # fmt: skip
    preflight(config)
    started = time.monotonic()
    records = run_in_process(config)
    results = summarise(records, reference=reference_answer(config)).to_json()
    results["wall_s"] = time.monotonic() - started
    return results


def to_target(results: dict[str, Any], target: float) -> tuple[float | None, int | None]:
    """Megabytes sent and rounds taken until the mean accuracy first reached ``target``."""
    for row in results["rounds"]:
        if row["mean_accuracy"] is not None and row["mean_accuracy"] >= target:
            return row["bytes_sent"] / 1e6, row["round"]
    return None, None


def fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def learning_table(rows: list[Row], args: argparse.Namespace) -> list[str]:
    settings = {
        "agents": args.agents, "rounds": args.rounds, "seed": args.seed,
        "task": {"name": "digits", "partition": "dirichlet", "alpha": args.alpha},
    }  # fmt: skip
    lines = [
        f"| algorithm | topology | compression | loss | accuracy (min) | consensus distance "
        f"| MB sent | bytes vs baseline | MB to {args.target:.2f} | rounds to {args.target:.2f} |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    baseline_bytes: float | None = None
    for row in rows:
        results = run(row, settings)
        final = results["final"]
        if row == BASELINE:
            baseline_bytes = final["bytes_sent"]
        ratio = final["bytes_sent"] / baseline_bytes if baseline_bytes else None
        megabytes, rounds = to_target(results, args.target)
        lines.append(
            f"| {row.label} | {row.topology} | {row.compression} | {row.loss:g} "
            f"| {final['mean_accuracy']:.4f} ({final['min_accuracy']:.4f}) "
            f"| {final['consensus_distance']:.2e} | {final['bytes_sent'] / 1e6:.2f} "
            f"| {fmt(ratio, '.3f')} | {fmt(megabytes, '.2f')} | {fmt(rounds, 'd')} |"
        )
        print(f"  {row.label} · {row.topology} · {row.compression} · loss {row.loss:g}: "
              f"{results['wall_s']:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
    return lines


def consensus_table(rows: list[Row], args: argparse.Namespace) -> list[str]:
    settings = {"agents": 8, "rounds": 120, "seed": args.seed, "task": {"name": "consensus"}}
    lines = [
        "| algorithm | topology | compression | loss | relative error | MB sent |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        final = run(row, settings)["final"]
        lines.append(
            f"| {row.label} | {row.topology} | {row.compression} | {row.loss:g} "
            f"| {final['relative_error']:.1e} | {final['bytes_sent'] / 1e6:.3f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--alpha", type=float, default=0.1, help="Dirichlet non-IID skew")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.9, help="accuracy to reach")
    parser.add_argument("--only", default="", help="keep rows whose algorithm contains this")
    parser.add_argument("--skip-consensus", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.monotonic()
    learning = [r for r in LEARNING if args.only in r.algorithm]
    if args.only and BASELINE not in learning:
        learning.insert(0, BASELINE)  # the ratios need it
    lines = [
        f"Learning: digits, {args.agents} agents, Dirichlet alpha {args.alpha:g}, "
        f"{args.rounds} rounds, seed {args.seed}; baseline: push-sum, exponential, none, 0.1.",
        "",
        *learning_table(learning, args),
    ]
    if not args.skip_consensus:
        rows = [r for r in CONSENSUS if args.only in r.algorithm]
        lines += ["", f"Consensus: 8 agents, 120 rounds, seed {args.seed}.", ""]
        lines += consensus_table(rows, args)
    elapsed = time.monotonic() - started
    lines += ["", f"({elapsed / 60:.1f} min, torch {torch.__version__}, 1 thread)"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
