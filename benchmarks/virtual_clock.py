"""Benchmark: a large fleet on the virtual clock over a wireless scenario.

    python benchmarks/virtual_clock.py                       # 1,000 agents, lte-urban, 100 rounds
    python benchmarks/virtual_clock.py --agents 200 --rounds 20
    python benchmarks/virtual_clock.py --task digits --config benchmarks/configs/digits-fleet.toml

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

from airgossip.emulation.fleets import run_fleet
from airgossip.emulation.fleets.inproc import run_in_process
from airgossip.emulation.networks import network_for
from airgossip.scenario.config import RunConfig, load_config, read_scenario
from airgossip.scenario.wireless import scenario_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--scenario", default="lte-urban")
    parser.add_argument("--task", default="consensus")
    parser.add_argument("--baseline-rounds", type=int, default=10, help="0: no baseline")
    parser.add_argument("--network", choices=("wireless", "static"), default="wireless",
                        help="static: the lock-step in-process driver on --topology with "
                        "--loss, no channel model")  # fmt: skip
    parser.add_argument("--topology", default="exponential")
    parser.add_argument("--loss", type=float, default=0.05)
    parser.add_argument("--area-scale", type=float, default=1.0,
                        help="scale the scenario's area (same density at more agents)")  # fmt: skip
    parser.add_argument("--config", type=Path, default=None,
                        help="a TOML scenario file over the preset (as airgossip run --config): "
                        "task options, [wireless] keys such as max_out_degree")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.network == "static":
        config = load_config(args.config, {
            "mode": "inproc", "agents": args.agents, "rounds": args.rounds,
            "task": {"name": args.task}, "topology": args.topology,
            "network": {"loss": args.loss},
        })  # fmt: skip
    else:
        base = read_scenario(scenario_path(args.scenario))
        if args.area_scale != 1.0:
            mobility = base["wireless"].setdefault("mobility", {})
            area = mobility.get("area_m", [100.0, 100.0])
            mobility["area_m"] = [float(a) * args.area_scale for a in area]
        settings = {"mode": "virtual", "agents": args.agents, "rounds": args.rounds,
                    "task": {"name": args.task}}  # fmt: skip
        config = load_config(args.config, settings, base=base)

    with tempfile.TemporaryDirectory() as out:
        wall, cpu = time.perf_counter(), time.process_time()
        results = run_fleet(config, Path(out)).to_json()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    final = results["final"]
    messages = final["messages_sent"]
    label = args.scenario if args.network == "wireless" else f"static {args.topology}"
    print(f"{config.mode} · {label} · {args.agents} agents · {args.task} · {args.rounds} rounds")
    print(f"  wall {wall:.1f} s · cpu {cpu:.1f} s · {messages} messages · "
          f"{cpu / messages * 1e6:.0f} us cpu per message")  # fmt: skip
    w = results.get("wireless") or {}
    if w:
        print(f"  emulated network time {w['emulated_s']:.1f} s · drop rate "
              f"{final.get('drop_rate') or 0:.3f} · radio links {w['mean_radio_links']:.0f}"
              f" · gossip links {w['mean_gossip_links']:.0f}")  # fmt: skip
    if final.get("relative_error") is not None:
        print(f"  consensus relative error {final['relative_error']:.3e} · consensus distance "
              f"{final['consensus_distance']:.3e}")  # fmt: skip
    if final.get("mean_accuracy") is not None:
        print(f"  mean accuracy {final['mean_accuracy']:.4f}")
    per = cpu / messages
    figures = {
        "agents": args.agents, "rounds": args.rounds, "network": label, "mode": config.mode,
        "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "messages": messages,
        "us_cpu_per_message": round(per * 1e6, 1), "emulated_s": w.get("emulated_s"),
        "relative_error": final.get("relative_error"),
        "mean_accuracy": final.get("mean_accuracy"),
    }  # fmt: skip
    if args.network == "wireless" and args.baseline_rounds > 0:
        figures.update(baseline(config, args, per))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


def baseline(config: RunConfig, args: argparse.Namespace, per: float) -> dict[str, float]:
    """The lock-step driver, no link model, on the scenario's first gossip graph."""
    adjacency = network_for(config).first_graph().phases[0]
    edges = [[int(i), int(j)] for i, j in zip(*np.nonzero(adjacency), strict=True)]
    lockstep = load_config(None, {
        "mode": "inproc", "agents": args.agents, "rounds": args.baseline_rounds,
        "task": config.task.model_dump(), "topology": "edges", "edges": edges,
        "network": {"loss": 0.0},
    })  # fmt: skip
    b_cpu = time.process_time()
    records = run_in_process(lockstep)
    b_cpu = time.process_time() - b_cpu
    b_messages = sum(r[-1].counters.messages_sent for r in records.values())
    b_per = b_cpu / b_messages
    print(f"baseline: lock-step, no link model, same graph, {args.baseline_rounds} rounds: "
          f"cpu {b_cpu:.1f} s · {b_messages} messages · "
          f"{b_per * 1e6:.0f} us cpu per message")  # fmt: skip
    print(f"ratio (virtual clock + channel model / lock-step), cpu per message: {per / b_per:.2f}")
    return {"baseline_us_cpu_per_message": round(b_per * 1e6, 1),
            "ratio_to_lockstep": round(per / b_per, 3)}  # fmt: skip


if __name__ == "__main__":
    main()
