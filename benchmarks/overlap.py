"""Overlap: does gossip hide behind computation?

Two agent processes over real gRPC train a compute-bound model (digits, one hidden layer of
``HIDDEN`` units: about 4.9M parameters, a 20 MB message; ``STEPS`` local steps of batch
``BATCH`` a round). The same run twice: with gossip (push-sum, each agent pushing its model
to the other every round) and without (local SGD that never averages: the same processes,
task and rounds, no message sent). Per-round wall time is the slope of the fleet's round
records after the first round (start-up excluded); the two kinds of run alternate and the
fastest of each counts (the load of a shared machine changes between runs).

Target: a round with gossip takes <= 1.2x a round without.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.suite import Context, Outcome, airgossip_run

HIDDEN, STEPS, BATCH = 65536, 10, 32


def _config(path: Path, rounds: int, gossip: bool) -> None:
    algorithm = (
        'algorithm = "push-sum"'
        if gossip
        else 'algorithm = "local-sgd"\n[algorithm_options]\nperiod = 100000'
    )
    path.write_text(
        f"""agents = 2
topology = "complete"
rounds = {rounds}
seed = 0
wait_timeout_s = 5.0
{algorithm}

[task]
name = "digits"
hidden = {HIDDEN}
local_steps = {STEPS}
batch_size = {BATCH}
lr = 0.05

[network]
loss = 0.0
"""
    )


def _per_round(ctx: Context, rounds: int, gossip: bool, repeat: int) -> dict[str, Any]:
    name = f"{'gossip' if gossip else 'local'}-{repeat}"
    config = ctx.work / f"{name}.toml"
    _config(config, rounds, gossip)
    out = ctx.work / name
    results = airgossip_run(config, out)
    rows = [r for r in results["rounds"] if r["round"] >= 1]
    first, last = rows[0], rows[-1]
    seconds = (last["train_wall_s"] - first["train_wall_s"]) / (last["round"] - first["round"])
    return {"per_round_s": seconds, "messages": results["final"]["messages_sent"],
            "bytes": results["final"]["bytes_sent"]}  # fmt: skip


def run(ctx: Context) -> list[Outcome]:
    rounds = 6 if ctx.quick else 12
    repeats = 1 if ctx.quick else 2
    # Alternated, the fastest of each kept: on a shared machine the load changes between runs.
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for repeat in range(repeats):
        for gossip in (False, True):
            runs[gossip].append(_per_round(ctx, rounds, gossip, repeat))
    without = min(runs[False], key=lambda r: r["per_round_s"])
    with_gossip = min(runs[True], key=lambda r: r["per_round_s"])
    ratio = with_gossip["per_round_s"] / without["per_round_s"]
    figures = {"rounds": rounds, "hidden": HIDDEN, "local_steps": STEPS, "runs": {
        "without": runs[False], "with": runs[True]}, "ratio": round(ratio, 3)}  # fmt: skip
    return [
        Outcome(
            "overlap",
            "compute-bound round with gossip <= 1.2x a round without",
            f"{with_gossip['per_round_s']:.2f} s / {without['per_round_s']:.2f} s = {ratio:.2f}x "
            f"({with_gossip['bytes'] / 1e6:.0f} MB gossiped; {without['bytes'] / 1e6:.0f} MB "
            "without)",
            ratio <= 1.2,
            figures,
        )
    ]
