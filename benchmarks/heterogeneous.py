"""Uneven fleets: rounds against an asynchronous pace, on device classes (docs/devices.md).

    python -m benchmarks --only uneven          # about 5 minutes on 2 cores
    python -m benchmarks.heterogeneous          # the same, its table on stdout

Two measurements, each against its baseline in the same run:

* **Virtual clock**: 100 agents learning digits on the ``lte-urban`` preset, three device
  classes (:data:`CLASSES`: 20% of the agents five times slower, 10% off half of the time
  at random, the rest at the host's speed, every class drawing power). The same fleet runs
  in rounds (``pace = "rounds"``, the straggler-aware baseline: a round waits at most
  ``wait_timeout_s`` for in-neighbours within ``staleness`` rounds, and not at all for one
  more than a few rounds behind) and at its own pace (``pace = "async"``). Per pace: the
  emulated time at which the fleet's mean accuracy (every agent's latest report) first
  reaches :data:`TARGET`, and the mean energy an agent had spent by then. Goal: the
  asynchronous fleet there in at most 0.6 of the rounds' time.
* **Agent processes**: 8 agents (real gRPC, process mode), 2 of them at a quarter of the
  host's speed, at their own pace, on compute-bound rounds (400 local steps each): how much
  longer the slow agents' rounds really take than the others' while all of them run (their
  steps are stretched, ~4x), and the fleet's final mean accuracy.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from airgossip.edge.observability.stats import RoundRecord
from airgossip.emulation.fleets import run_fleet
from airgossip.emulation.fleets.base import Fleet
from airgossip.emulation.fleets.virtual import VirtualFleet
from airgossip.emulation.networks import network_for
from airgossip.scenario.config import load_config, read_scenario
from airgossip.scenario.results import time_to_accuracy
from airgossip.scenario.wireless import scenario_path
from benchmarks.suite import Context, Outcome

TARGET = 0.90
#: Powers (W) of a phone-class device: compute, transmit, receive.
WATTS = {"compute_w": 3.0, "tx_w": 1.2, "rx_w": 0.8}
CLASSES: list[dict[str, Any]] = [
    {"name": "slow", "fraction": 0.2, "speed": 0.2, **WATTS},
    {"name": "flaky", "fraction": 0.1, "availability": {"kind": "random", "on_s": 2.0,
                                                        "off_s": 2.0}, **WATTS},
    {"name": "phone", "fraction": 0.7, **WATTS},
]  # fmt: skip


def virtual_run(agents: int, rounds: int, pace: str) -> dict[str, Any]:
    """One virtual-clock fleet: time and energy to :data:`TARGET`, and its cost here."""
    base: dict[str, Any] = read_scenario(scenario_path("lte-urban"))
    config = load_config(None, {
        "mode": "virtual", "agents": agents, "rounds": rounds, "seed": 1, "pace": pace,
        "task": {"name": "digits"}, "device_classes": CLASSES,
    }, base=base)  # fmt: skip
    began, cpu = time.monotonic(), time.process_time()
    fleet = VirtualFleet(config, network_for(config))
    fleet.run()
    records = fleet.records()
    reached = time_to_accuracy(records, TARGET)
    finals = [rs[-1] for rs in records.values()]
    milestones = {}
    for target in (0.8, 0.85, TARGET):
        moment = time_to_accuracy(records, target)
        if moment is not None:
            milestones[str(target)] = {"time_s": moment.time_s, "energy_j": moment.mean_energy_j}
    return {
        "pace": pace,
        "milestones": milestones,
        "time_to_target_s": None if reached is None else reached.time_s,
        "energy_to_target_j": None if reached is None else reached.mean_energy_j,
        "final_mean_accuracy": statistics.fmean(r.metrics["accuracy"] for r in finals),
        "end_s": max(r.wall_s for r in finals),
        "mean_energy_j": statistics.fmean(r.metrics["energy_j"] for r in finals),
        "wall_s": round(time.monotonic() - began, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }


def virtual_outcome(quick: bool) -> Outcome:
    agents, rounds = (40, 40) if quick else (100, 60)
    runs = {pace: virtual_run(agents, rounds, pace) for pace in ("rounds", "async")}
    synced, free = runs["rounds"], runs["async"]
    both = synced["time_to_target_s"] is not None and free["time_to_target_s"] is not None
    ratio = free["time_to_target_s"] / synced["time_to_target_s"] if both else None

    def said(run: dict[str, Any]) -> str:
        if run["time_to_target_s"] is None:
            return (f"{run['pace']}: not at {TARGET} in {rounds} rounds (final "
                    f"{run['final_mean_accuracy']:.3f} at {run['end_s']:.1f} s)")  # fmt: skip
        return (f"{run['pace']}: {run['time_to_target_s']:.1f} s emulated, "
                f"{run['energy_to_target_j']:.1f} J an agent")  # fmt: skip

    measured = f"{said(free)}; {said(synced)}"
    if ratio is not None:
        measured = f"{ratio:.2f}x the rounds' time ({measured})"
    # Not met where only the rounds got there; not measured where neither did.
    met = None if synced["time_to_target_s"] is None else ratio is not None and ratio <= 0.6
    return Outcome(
        "uneven-virtual",
        f"{agents} agents, lte-urban, 3 device classes: async reaches {TARGET} mean accuracy "
        "in <= 0.6x the emulated time of rounds",
        measured,
        met,
        {"agents": agents, "rounds": rounds, "classes": CLASSES, "runs": runs, "ratio": ratio},
        "" if synced["time_to_target_s"] is not None else "the rounds never reached the target",
    )


def seconds_per_round(records: dict[str, list[RoundRecord]]) -> dict[str, float]:
    """Each agent's seconds per round while every agent was still running (until the first
    finished): after that the others have this machine's cores to themselves, and every
    emulated speed is relative to the machine's."""
    until = min(rs[-1].wall_s for rs in records.values())
    per_round = {}
    for agent_id, rs in records.items():
        last = max((r for r in rs if r.round > 0 and r.wall_s <= until), key=lambda r: r.round)
        per_round[agent_id] = last.wall_s / last.round
    return per_round


def process_outcome(quick: bool) -> Outcome:
    rounds = 12 if quick else 20
    slow = [6, 7]
    config = load_config(None, {
        "mode": "process", "agents": 8, "rounds": rounds, "seed": 2, "pace": "async",
        # compute-bound rounds, as on a device whose steps are long: 400 steps a round
        "task": {"name": "digits", "local_steps": 400}, "network": {"loss": 0.0},
        "device_classes": [{"name": "pi", "agents": slow, "speed": 0.25, **WATTS}],
    })  # fmt: skip
    fleets: list[Fleet] = []
    with tempfile.TemporaryDirectory(prefix="uneven-") as folder:
        results = run_fleet(config, Path(folder) / "run", on_start=fleets.append)
        records = fleets[0].records()
    per_round = seconds_per_round(records)
    slow_s = statistics.fmean(per_round[f"agent-{i}"] for i in slow)
    fast_s = statistics.fmean(v for a, v in per_round.items() if int(a.split("-")[1]) not in slow)
    ratio = slow_s / fast_s
    accuracy = results.final.mean_accuracy or 0.0
    met = 3.0 <= ratio <= 5.0 and accuracy >= TARGET
    return Outcome(
        "uneven-process",
        f"8 agent processes, 2 at 1/4 speed, async: their rounds take ~4x, the fleet reaches "
        f"{TARGET}",
        f"slow agents' rounds {slow_s:.3f} s against {fast_s:.3f} s ({ratio:.2f}x, while all "
        f"ran); final mean accuracy {accuracy:.3f} after {rounds} rounds",
        met,
        {"seconds_per_round": per_round, "ratio": ratio, "final_mean_accuracy": accuracy},
    )


def run(ctx: Context) -> list[Outcome]:
    torch.set_num_threads(1)
    return [virtual_outcome(ctx.quick), process_outcome(ctx.quick)]


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    for outcome in run(Context(quick, Path(tempfile.gettempdir()), Path("."))):
        print(f"{outcome.target}: {outcome.measured}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
