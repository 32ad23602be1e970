"""Benchmark: a large fleet on the virtual clock over a wireless scenario.

    python benchmarks/virtual_clock.py                       # 1,000 agents, lte-urban, 100 rounds
    python benchmarks/virtual_clock.py --agents 200 --rounds 20

Prints wall and CPU seconds, the emulated network time, and the cost per message beside a
baseline measured in the same run: the lock-step in-process driver with no link model over
the same gossip graph (so the ratio is what the channel model and the event loop add).
CPU seconds are the figure to compare on a shared machine: wall time there also counts
other people's work.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emulation.config import load_config, read_scenario
from emulation.fleets import run_fleet
from emulation.fleets.inproc import run_in_process
from emulation.networks import network_for
from emulation.scenario import scenario_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--scenario", default="lte-urban")
    parser.add_argument("--task", default="consensus")
    parser.add_argument("--baseline-rounds", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = read_scenario(scenario_path(args.scenario))
    settings = {"mode": "virtual", "agents": args.agents, "rounds": args.rounds,
                "task": {"name": args.task}}  # fmt: skip
    config = load_config(None, settings, base=base)

    with tempfile.TemporaryDirectory() as out:
        wall, cpu = time.perf_counter(), time.process_time()
        results = run_fleet(config, Path(out)).to_json()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    final = results["final"]
    messages = final["messages_sent"]
    print(f"virtual clock · {args.scenario} · {args.agents} agents · {args.task} · "
          f"{args.rounds} rounds")  # fmt: skip
    print(f"  wall {wall:.1f} s · cpu {cpu:.1f} s · {messages} messages · "
          f"{cpu / messages * 1e6:.0f} us cpu per message")  # fmt: skip
    w = results["wireless"]
    print(f"  emulated network time {w['emulated_s']:.1f} s · drop rate "
          f"{final.get('drop_rate') or 0:.3f} · radio links {w['mean_radio_links']:.0f}"
          f" · gossip links {w['mean_gossip_links']:.0f}")  # fmt: skip
    if final.get("relative_error") is not None:
        print(f"  consensus relative error {final['relative_error']:.3e} · consensus distance "
              f"{final['consensus_distance']:.3e}")  # fmt: skip

    # Baseline: the lock-step driver, no link model, on the scenario's first gossip graph.
    adjacency = network_for(config).first_graph().phases[0]
    edges = [[int(i), int(j)] for i, j in zip(*np.nonzero(adjacency), strict=True)]
    baseline = load_config(None, {
        "mode": "inproc", "agents": args.agents, "rounds": args.baseline_rounds,
        "task": {"name": args.task}, "topology": "edges", "edges": edges,
        "network": {"loss": 0.0},
    })  # fmt: skip
    b_wall, b_cpu = time.perf_counter(), time.process_time()
    records = run_in_process(baseline)
    b_wall, b_cpu = time.perf_counter() - b_wall, time.process_time() - b_cpu
    b_messages = sum(r[-1].counters.messages_sent for r in records.values())
    per = cpu / messages
    b_per = b_cpu / b_messages
    print(f"baseline: lock-step, no link model, same graph, {args.baseline_rounds} rounds: "
          f"cpu {b_cpu:.1f} s · {b_messages} messages · "
          f"{b_per * 1e6:.0f} us cpu per message")  # fmt: skip
    print(f"ratio (virtual clock + channel model / lock-step), cpu per message: {per / b_per:.2f}")
    if args.json is not None:
        figures = {
            "agents": args.agents, "rounds": args.rounds, "scenario": args.scenario,
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "messages": messages,
            "us_cpu_per_message": round(per * 1e6, 1), "emulated_s": w["emulated_s"],
            "baseline_us_cpu_per_message": round(b_per * 1e6, 1),
            "ratio_to_lockstep": round(per / b_per, 3),
            "relative_error": final.get("relative_error"),
        }  # fmt: skip
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
