"""Kept as regressions: figures an earlier change established, re-measured every run.

* qsgd:4 quantized push-sum sends >= 7x fewer bytes than float32 quantized push-sum for the
  same accuracy (within 0.01) on digits: the setting of claim C2 in docs/algorithms.md
  (16 agents in-process, Dirichlet 0.1, 80 rounds, 10% loss), both in this run;
* exact consensus at 0% loss over real gRPC (agent processes) needs no more than 1.5x the
  rounds the lock-step in-process fleet needs to bring the consensus distance under 1e-8
  (8 agents, exponential graph), both in this run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from airgossip.emulation.fleets import preflight
from airgossip.emulation.fleets.inproc import run_in_process
from airgossip.scenario.config import load_config
from airgossip.scenario.results import summarise
from benchmarks.suite import Context, Outcome

ROOT = Path(__file__).resolve().parent.parent
AGREEMENT = 1e-8


def _learn(rounds: int, **settings: Any) -> dict[str, Any]:
    task = {"name": "digits", "partition": "dirichlet", "alpha": 0.1}
    base = {"mode": "inproc", "agents": 16, "rounds": rounds, "task": task,
            "algorithm": "quantized-push-sum"}  # fmt: skip
    config = load_config(None, {**base, **settings})
    preflight(config)
    final: dict[str, Any] = summarise(run_in_process(config)).to_json()["final"]
    return final


def quantized(ctx: Context) -> Outcome:
    rounds = 40 if ctx.quick else 80
    exact = _learn(rounds)
    four = _learn(rounds, compression="qsgd:4")
    ratio = exact["bytes_sent"] / four["bytes_sent"]
    gap = abs(exact["mean_accuracy"] - four["mean_accuracy"])
    figures = {
        "rounds": rounds,
        "float32": {"accuracy": exact["mean_accuracy"], "bytes": exact["bytes_sent"]},
        "qsgd4": {"accuracy": four["mean_accuracy"], "bytes": four["bytes_sent"]},
        "ratio": round(ratio, 2),
    }
    return Outcome(
        "qsgd:4 bytes",
        ">= 7x fewer bytes than float32 for the same accuracy (quantized push-sum, digits)",
        f"{exact['bytes_sent'] / 1e6:.2f} MB / {four['bytes_sent'] / 1e6:.2f} MB = "
        f"{ratio:.2f}x; accuracy {exact['mean_accuracy']:.4f} vs {four['mean_accuracy']:.4f}",
        ratio >= 7 and gap <= 0.01,
        figures,
        note="" if rounds == 80 else f"--quick: {rounds} rounds",
    )


def _rounds_to_agree(rounds: list[dict[str, Any]]) -> int | None:
    for row in rounds:
        distance = row.get("consensus_distance")
        if row["round"] > 0 and distance is not None and distance <= AGREEMENT:
            return int(row["round"])
    return None


def consensus(ctx: Context) -> Outcome:
    settings = {"agents": 8, "rounds": 60, "task": {"name": "consensus"},
                "network": {"loss": 0.0}}  # fmt: skip
    lockstep = summarise(run_in_process(load_config(None, {**settings, "mode": "inproc"})))
    inproc_rounds = _rounds_to_agree(lockstep.to_json()["rounds"])
    out = ctx.work / "grpc"
    subprocess.run(
        [sys.executable, "-m", "airgossip", "run", "--task", "consensus", "--agents", "8",
         "--rounds", "60", "--loss", "0", "--out", str(out)],
        check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    grpc_rounds = _rounds_to_agree(results["rounds"])
    figures = {"inproc_rounds": inproc_rounds, "grpc_rounds": grpc_rounds,
               "grpc_relative_error": results["final"].get("relative_error")}  # fmt: skip
    met = None
    measured = f"in-process {inproc_rounds}, gRPC {grpc_rounds} rounds to distance <= 1e-8"
    if inproc_rounds and grpc_rounds:
        met = grpc_rounds <= 1.5 * inproc_rounds
        measured += f" ({grpc_rounds / inproc_rounds:.2f}x)"
    elif inproc_rounds:
        met = False
    return Outcome(
        "consensus rounds",
        "exact consensus at 0% loss over real gRPC in <= 1.5x the lock-step rounds",
        measured, met, figures,
    )  # fmt: skip


def run(ctx: Context) -> list[Outcome]:
    return [quantized(ctx), consensus(ctx)]
