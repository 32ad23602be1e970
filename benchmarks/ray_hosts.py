"""Ray mode at scale: many agents forked by host actors on a small multi-node Ray cluster.

    python -m benchmarks.ray_hosts --agents 64 --rounds 40 --num-cpus 0.05
    python -m benchmarks.ray_hosts --agents 256 --rounds 40 --num-cpus 0.02

Starts a Ray cluster of ``--nodes`` nodes x ``--cpus`` CPUs on this machine's loopback
(``ray.cluster_utils.Cluster``, Ray's default health checks) in a child process, and runs
the digits task there in ``--mode ray`` (the driver in that child too). Measured: the run's
wall time from the launch of the fleet (the cluster already up, as ``airgossip run`` on a
running cluster) to its results; its start-up from the agents' logs (the last agent
serving; the median and the last agent to start training once the fleet was full); the
final mean accuracy; the peak memory of everything the child runs (Ray's
processes, the driver, the hosts, their fork servers and agents: summed PSS, shared pages
split between the processes that map them) and the peak of the machine's used memory
(``MemTotal - MemAvailable``) above what it was before the cluster started, which also
counts whatever else the machine runs meanwhile. Prints one JSON object. Not part of the
benchmark suite (it needs 2 GB to 10 GB and minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.proctree import TreeWatch, pss_bytes, tree


def used_bytes() -> int:
    """The machine's used memory: ``MemTotal - MemAvailable``."""
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        info[name] = int(rest.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


def role(pid: int) -> str:
    """What a process of the run is, for the memory breakdown."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text(errors="replace").strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return "other"
    text = cmdline.decode(errors="replace")
    if comm.startswith("agent-"):
        return "agents"
    if "airgossip.emulation.fleets.forkserver" in text:
        return "fork servers"
    if "RayAgentHost" in text or "RayAgentHost" in comm:
        return "host workers"
    if "benchmarks.ray_hosts" in text:
        return "driver"
    return "ray" if "ray" in text or "raylet" in comm or "gcs" in comm else "other"


def pss_by_role(root: int) -> dict[str, float]:
    """Summed PSS of the tree under ``root``, by :func:`role`."""
    out: dict[str, float] = {}
    for pid in tree(root):
        out[role(pid)] = out.get(role(pid), 0) + pss_bytes(pid)
    return out


def line_times(out: Path, words: str, launched_at: float) -> list[float]:
    """Seconds from the launch to each agent's first log line with ``words`` (``serving
    on``: the agent is up; `` starts: ``: the fleet is full and it trains), sorted."""
    import datetime

    found = []
    for log in out.glob("logs/agent-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if words in line:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                found.append(stamp.timestamp() - launched_at)
                break
    return sorted(found)


def child(args: argparse.Namespace) -> None:
    """Start the cluster, run the fleet, write what was measured to ``args.report``."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only
    os.environ["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "0"
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    from airgossip.emulation.fleets import run_fleet
    from airgossip.scenario.config import load_config

    ray_constants.ENABLE_RAY_CLUSTER = False
    node = {"node_ip_address": "127.0.0.1", "num_cpus": args.cpus, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    for _ in range(1, args.nodes):
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    settings: dict[str, object] = {"address": cluster.address, "num_cpus": args.num_cpus}
    if args.agents_per_host:
        settings["agents_per_host"] = args.agents_per_host
    config = load_config(
        None, {"mode": "ray", "agents": args.agents, "rounds": args.rounds, "ray": settings}
    )
    launched = time.monotonic()
    launched_at = time.time()
    report: dict[str, object] = {}
    try:
        results = run_fleet(config, Path(args.out))
        final = results.final
        report = {
            "mean_accuracy": None if final is None else final.mean_accuracy,
            "agents_reporting": None if final is None else final.agents_reporting,
        }
    except Exception as err:
        report = {"error": f"{type(err).__name__}: {err}"}
    report["wall_s"] = round(time.monotonic() - launched, 1)
    serving = line_times(Path(args.out), "serving on", launched_at)
    starts = line_times(Path(args.out), " starts: ", launched_at)
    report["last_serving_s"] = round(serving[-1], 1) if serving else None
    report["median_start_s"] = round(starts[len(starts) // 2], 1) if starts else None
    report["last_start_s"] = round(starts[-1], 1) if starts else None
    Path(args.report).write_text(json.dumps(report))
    ray.shutdown()
    cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--num-cpus", type=float, default=0.05, help="[ray] num_cpus")
    parser.add_argument("--agents-per-host", type=int, default=0, help="0: the default")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2, help="logical CPUs of each node")
    parser.add_argument("--out", default="runs/bench-ray-hosts")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = out / "measured.json"
    before = used_bytes()
    load = os.getloadavg()[0]
    command = [
        sys.executable, "-m", "benchmarks.ray_hosts", "--child", "--agents", str(args.agents),
        "--rounds", str(args.rounds), "--num-cpus", str(args.num_cpus), "--agents-per-host",
        str(args.agents_per_host), "--nodes", str(args.nodes), "--cpus", str(args.cpus),
        "--out", str(out / f"run-{time.strftime('%H%M%S')}"), "--report", str(report),
    ]  # fmt: skip
    process = subprocess.Popen(command, start_new_session=True)
    watch = TreeWatch(process.pid, interval_s=0.5).start()
    peak_used = [before]
    peak_parts: dict[str, float] = {}
    done = threading.Event()

    def sample_machine() -> None:
        while not done.wait(0.5):
            peak_used[0] = max(peak_used[0], used_bytes())
            parts = pss_by_role(process.pid)
            if sum(parts.values()) > sum(peak_parts.values()):
                peak_parts.clear()
                peak_parts.update(parts)

    threading.Thread(target=sample_machine, daemon=True).start()
    process.wait()
    done.set()
    watch.stop()
    figures = json.loads(report.read_text()) if report.exists() else {"error": "no report"}
    figures.update(
        agents=args.agents, rounds=args.rounds, num_cpus=args.num_cpus,
        nodes=f"{args.nodes} x {args.cpus} CPUs", load_before=round(load, 1),
        load_after=round(os.getloadavg()[0], 1), processes=len(watch.cpu),
        peak_pss_gib=round(watch.peak_pss / 2**30, 2),
        peak_used_delta_gib=round((peak_used[0] - before) / 2**30, 2),
        cpu_s=round(sum(watch.cpu.values()), 1),
        peak_pss_by_role_gib={k: round(v / 2**30, 2) for k, v in sorted(peak_parts.items())},
    )  # fmt: skip
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
