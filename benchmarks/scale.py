"""Scale: many agents on the virtual clock over the lte-urban wireless scenario (consensus).

Runs ``benchmarks/virtual_clock.py`` in a process of its own (so its peak PSS is its own):
1,000 agents for 100 rounds, and 10,000 agents for 20 rounds, each with its baseline in the
same process (the lock-step in-process driver on the same gossip graph, no link model: CPU
per message). Targets: 1,000 x 100 in < 30 s and < 4 GB; 10,000 x 20 in < 3 minutes and
< 16 GB.

A run that the dense channel model could not hold in this machine's memory is not started:
the table says how much it would need.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.proctree import run_watched
from benchmarks.suite import Context, Outcome

ROOT = Path(__file__).resolve().parent.parent

#: Bytes per directed link a large virtual-clock run holds at its peak: the dense channel model
#: with its cache down to two steps (35 bytes a link each), its own state (16), what computing
#: a step adds, and the agents. Measured: the model alone 97 at 3,000 nodes; the whole
#: 10,000-agent process 13.4 GB of maximum RSS (134) before it was stopped in round 1.
CHANNEL_BYTES_PER_LINK = 134


#: How long one run may take before it is reported as not finished.
TIMEOUT_S = 3600


def dense_channel_bytes(n: int) -> int:
    """What a run of n agents holds at its peak, the dense n x n channel model most of it
    (estimate)."""
    return n * n * CHANNEL_BYTES_PER_LINK


def _memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _one(ctx: Context, agents: int, rounds: int, seconds: float, gib: float) -> Outcome:
    goal = f"{agents:,} agents x {rounds} rounds: < {seconds:.0f} s and < {gib:.0f} GB"
    need = dense_channel_bytes(agents)
    available = _memory_bytes()
    if need > 0.8 * available:
        return Outcome(
            f"scale {agents:,}",
            goal,
            f"not run: it would hold about {need / 1e9:.0f} GB (the dense channel model) "
            f"({available / 1e9:.0f} GB available)",
            False,
            {"dense_channel_bytes_estimate": need, "available_bytes": available},
        )
    out = ctx.work / f"virtual-{agents}.json"
    log = ctx.work / f"virtual-{agents}.log"
    try:
        cost = run_watched(
            [sys.executable, str(ROOT / "benchmarks" / "virtual_clock.py"), "--agents",
             str(agents), "--rounds", str(rounds), "--baseline-rounds", "3", "--json", str(out)],
            log_path=log, cwd=ROOT, isolate_network=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout_s=TIMEOUT_S, interval_s=0.5,
        )  # fmt: skip
    except TimeoutError:
        # One run that does not finish must not cost the other run's row.
        return Outcome(f"scale {agents:,}", goal, f"not finished in {TIMEOUT_S} s (log {log})",
                       False, {"timeout_s": TIMEOUT_S})  # fmt: skip
    if cost.returncode != 0:
        raise RuntimeError(f"virtual_clock.py failed (log {log})")
    figures: dict[str, Any] = json.loads(out.read_text())
    figures.update(peak_pss_bytes=cost.peak_pss_bytes, process_wall_s=round(cost.wall_s, 1))
    fleet_s = figures["wall_s"]
    met = fleet_s < seconds and cost.peak_pss_bytes < gib * 1e9
    return Outcome(
        f"scale {agents:,}",
        goal,
        f"{fleet_s:.1f} s wall ({figures['cpu_s']:.1f} s CPU), peak PSS "
        f"{cost.peak_pss_bytes / 1e9:.2f} GB; {figures['us_cpu_per_message']:.0f} us CPU per "
        f"message vs lock-step {figures['baseline_us_cpu_per_message']:.0f} us "
        f"({figures['ratio_to_lockstep']:.2f}x)",
        met,
        figures,
    )


def run(ctx: Context) -> list[Outcome]:
    if ctx.quick:
        return [_one(ctx, 1000, 20, 6.0, 4.0)]
    return [_one(ctx, 1000, 100, 30.0, 4.0), _one(ctx, 10_000, 20, 180.0, 16.0)]
