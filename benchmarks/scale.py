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

#: Bytes per directed link of one cached channel step (the LinkState arrays), the model's
#: own state and the temporaries of one step, and how many steps the model caches.
LINK_STATE_BYTES, MODEL_STATE_BYTES, TEMPORARY_BYTES, CACHED_STEPS = 35, 16, 40, 8


def dense_channel_bytes(n: int) -> int:
    """What the dense n x n channel model holds at its peak (estimate)."""
    return n * n * (LINK_STATE_BYTES * CACHED_STEPS + MODEL_STATE_BYTES + TEMPORARY_BYTES)


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
            f"not run: the dense channel model would hold about {need / 1e9:.0f} GB "
            f"({available / 1e9:.0f} GB available)",
            False,
            {"dense_channel_bytes_estimate": need, "available_bytes": available},
        )
    out = ctx.work / f"virtual-{agents}.json"
    cost = run_watched(
        [sys.executable, str(ROOT / "benchmarks" / "virtual_clock.py"), "--agents", str(agents),
         "--rounds", str(rounds), "--baseline-rounds", "3", "--json", str(out)],
        log_path=ctx.work / f"virtual-{agents}.log", cwd=ROOT, isolate_network=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout_s=3600, interval_s=0.5,
    )  # fmt: skip
    if cost.returncode != 0:
        raise RuntimeError(f"virtual_clock.py failed (log {ctx.work / f'virtual-{agents}.log'})")
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
