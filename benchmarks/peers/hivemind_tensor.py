"""hivemind 1.1.12's ``DecentralizedAverager`` on one flat float32 tensor between two peers
on loopback: the time and CPU of an all-reduce, matchmaking left out.

Runs inside hivemind's own virtual environment (our package is not importable there)::

    python hivemind_tensor.py NUMEL STEPS OUT.json

Peer 0 (this process) starts the DHT, peer 1 (a child process) joins it. Each step is
scheduled ahead (``scheduled_time``, ``require_trigger``): both peers find their group
first, then peer 0 times from the trigger to the averaged result. Two peers average by
butterfly all-reduce: each sends the other half of its tensor and gets it back averaged,
so each step moves the tensor's size out of each peer and into it. CPU: both peers'
process trees (``/proc``: the averagers' processes and libp2p daemons included), per step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

PREFIX = "airgossip-tensor"
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant (the averagers run in processes of
    their own, libp2p in a daemon)."""
    parent, used = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parent[pid], used[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK
    total = 0.0
    for pid, seconds in used.items():
        walk = pid
        while walk in parent and walk != root:
            walk = parent[walk]
        if walk == root:
            total += seconds
    return total


def peer(index: int, numel: int, steps: int, maddr_file: str, out: str | None) -> None:
    import hivemind
    from hivemind.averaging.control import AveragingStage
    from hivemind.utils import get_dht_time

    torch.set_num_threads(1)
    if index == 0:
        dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        Path(maddr_file + ".tmp").write_text("\n".join(str(a) for a in dht.get_visible_maddrs()))
        Path(maddr_file + ".tmp").rename(maddr_file)
        child = subprocess.Popen(
            [sys.executable, __file__, "peer", "1", str(numel), str(steps), maddr_file]
        )
    else:
        while not Path(maddr_file).exists():
            time.sleep(0.05)
        initial = Path(maddr_file).read_text().split()
        dht = hivemind.DHT(start=True, initial_peers=initial, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    tensor = torch.randn(numel, generator=torch.Generator().manual_seed(index))
    averager = hivemind.averaging.DecentralizedAverager(
        [tensor], dht, start=True, prefix=PREFIX, target_group_size=2, min_group_size=2,
        min_matchmaking_time=2.0, request_timeout=1.0, allreduce_timeout=120.0,
    )  # fmt: skip
    seconds, cpu = [], []
    for step in range(steps + 1):
        control = averager.step(
            scheduled_time=get_dht_time() + 3.0, wait=False, require_trigger=True, timeout=120.0
        )
        while control.stage != AveragingStage.AWAITING_TRIGGER and not control.done():
            time.sleep(0.005)
        used = tree_cpu_seconds(os.getpid()) if index == 0 else 0.0
        began = time.perf_counter()
        control.allow_allreduce()
        group = control.result()
        took = time.perf_counter() - began
        used = (tree_cpu_seconds(os.getpid()) if index == 0 else 0.0) - used
        if step and index == 0:  # the first one warms up
            seconds.append(took)
            cpu.append(used)
        if index == 0:
            print(f"step {step}: {took:.3f} s, group {len(group) if group else 0}", flush=True)
    time.sleep(2.0)
    averager.shutdown()
    dht.shutdown()
    if index == 0:
        child.wait(timeout=60)
        Path(out or "").write_text(json.dumps({"numel": numel, "seconds": seconds, "cpu_s": cpu}))


if __name__ == "__main__":
    if sys.argv[1] == "peer":
        peer(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], None)
    else:
        maddr = f"{sys.argv[3]}.maddr"
        Path(maddr).unlink(missing_ok=True)
        peer(0, int(sys.argv[1]), int(sys.argv[2]), maddr, sys.argv[3])
