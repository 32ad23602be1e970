"""Benchmark: CPU per step of the dense channel model against the one over the links in range.

    python benchmarks/channel_step.py --nodes 4000 --model dense --area-scale 2
    python benchmarks/channel_step.py --nodes 4000 --model sparse --area-scale 2

Computes steps 0-2 of the lte-urban scenario (its area scaled by ``--area-scale``) and prints
the CPU seconds per step, the links that exist at the last step and the process's maximum
RSS. Run each model in a process of its own so that the RSS is its own.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airgossip.emulation.channel.model import ChannelModel
from airgossip.emulation.channel.sparse import SparseChannelModel
from airgossip.scenario.config import read_scenario
from airgossip.scenario.wireless import WirelessSettings, scenario_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--model", choices=("dense", "sparse"), default="sparse")
    parser.add_argument("--area-scale", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--scenario", default="lte-urban")
    args = parser.parse_args()
    wireless = read_scenario(scenario_path(args.scenario))["wireless"]
    assert isinstance(wireless, dict)
    mobility = wireless.setdefault("mobility", {})
    assert isinstance(mobility, dict)
    area = mobility.get("area_m", [100.0, 100.0])
    assert isinstance(area, list)
    mobility["area_m"] = [float(str(a)) * args.area_scale for a in area]
    settings = WirelessSettings.model_validate(wireless)
    kind = ChannelModel if args.model == "dense" else SparseChannelModel
    model = kind(settings, args.nodes, 1)
    cpu = time.process_time()
    for step in range(args.steps):
        state = model.state(step)
    per_step = (time.process_time() - cpu) / args.steps
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{args.model} · {args.scenario} x{args.area_scale:g} · {args.nodes} nodes: "
          f"{per_step:.2f} s CPU per step · {state.link_count()} links · "
          f"max RSS {rss / 1e9:.2f} GB")  # fmt: skip


if __name__ == "__main__":
    main()
