"""Start-up: 8 agents, digits, 5 rounds, agent processes over real gRPC, start-up included,
against Flower's simulation engine running the example Flower app for 5 rounds with 8
supernodes, both launched as a user would (``airgossip run``, ``airgossip baseline
flower``), in the same run.

Beside the two wall times: CPU seconds and peak PSS of each process tree, and what the
fleet's start-up costs: the fork server's imports (paid once) and each forked agent's own
start-up to serving (its log says), against what a fresh interpreter pays for the agent's
imports alone (what every agent paid before the fork server) and for ``import torch`` alone
(what lazy imports could never remove: the agent trains with torch from its first round).
Target: ours <= 1/3 of Flower's wall time.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
from pathlib import Path

from benchmarks.proctree import run_watched
from benchmarks.suite import Context, Outcome

ROOT = Path(__file__).resolve().parent.parent
FLOWER_APP = ROOT / "examples" / "flower-digits"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def startup_cpu(out: Path) -> dict[str, float]:
    """The fork server's imports and each agent's start-up (CPU seconds), from their logs."""
    figures: dict[str, float] = {}
    server = re.search(r"in ([0-9.]+) s of CPU", (out / "forkserver.log").read_text())
    if server:
        figures["forkserver_import_cpu_s"] = float(server.group(1))
    agents = [
        float(m.group(1))
        for log in sorted((out / "logs").glob("agent-*.log"))
        if (m := re.search(r"start-up took ([0-9.]+) s of CPU", log.read_text()))
    ]
    if agents:
        figures.update(
            agent_startup_cpu_mean_s=round(statistics.mean(agents), 3),
            agent_startup_cpu_max_s=max(agents),
            fleet_startup_cpu_s=round(figures.get("forkserver_import_cpu_s", 0.0) + sum(agents), 2),
        )  # fmt: skip
    return figures


def _startup_note(figures: dict[str, object]) -> str:
    if "agent_startup_cpu_mean_s" not in figures:
        return ""
    return (
        f"; start-up CPU: fork server's imports {figures.get('forkserver_import_cpu_s', 0)} s"
        f" + {figures['agent_startup_cpu_mean_s']} s per agent, against a fresh"
        f" interpreter's agent imports {figures['agent_import_cpu_s']} s per agent"
    )


def run(ctx: Context) -> list[Outcome]:
    env = _env()
    ours_cmd = [
        sys.executable, "-m", "airgossip", "run", "--agents", "8", "--rounds", "5",
        "--loss", "0", "--out", str(ctx.work / "ours"),
    ]  # fmt: skip
    import_cmd = [sys.executable, "-c", "import airgossip.node.process"]
    figures: dict[str, object] = {}
    imp = run_watched(import_cmd, log_path=ctx.work / "import.log", env=env, cwd=ROOT)
    figures["agent_import_wall_s"] = round(imp.wall_s, 2)
    figures["agent_import_cpu_s"] = round(imp.cpu_s, 2)
    print(f"  one agent's imports: {imp.wall_s:.2f} s wall, {imp.cpu_s:.2f} s CPU", flush=True)
    torch_cmd = [sys.executable, "-c", "import torch"]
    torch_only = run_watched(torch_cmd, log_path=ctx.work / "torch.log", env=env, cwd=ROOT)
    figures["torch_import_cpu_s"] = round(torch_only.cpu_s, 2)
    print(f"  import torch alone: {torch_only.cpu_s:.2f} s CPU", flush=True)
    ours = run_watched(ours_cmd, log_path=ctx.work / "ours.log", env=env, cwd=ROOT)
    if ours.returncode != 0:
        raise RuntimeError(f"airgossip run failed (log {ctx.work / 'ours.log'})")
    figures.update(
        ours_wall_s=round(ours.wall_s, 2), ours_cpu_s=round(ours.cpu_s, 1),
        ours_peak_pss_mib=round(ours.peak_pss_bytes / 2**20),
    )  # fmt: skip
    print(f"  airgossip run: {ours.wall_s:.1f} s wall, {ours.cpu_s:.1f} s CPU", flush=True)
    startup = startup_cpu(ctx.work / "ours")
    figures.update(startup)
    if "agent_startup_cpu_mean_s" in startup:
        print(
            f"  start-up: fork server's imports {startup.get('forkserver_import_cpu_s', 0):.2f} s"
            f" CPU, each agent {startup['agent_startup_cpu_mean_s']:.2f} s CPU"
            f" (max {startup['agent_startup_cpu_max_s']:.2f}), the fleet"
            f" {startup['fleet_startup_cpu_s']:.1f} s against 8 fresh interpreters'"
            f" imports {8 * imp.cpu_s:.1f} s",
            flush=True,
        )
    if ctx.quick:
        return [
            Outcome(
                "startup",
                "<= 1/3 of Flower's wall time (8 nodes, 5 rounds)",
                f"ours {ours.wall_s:.1f} s (Flower not run in --quick){_startup_note(figures)}",
                None,
                figures,
            )
        ]
    flower_cmd = [
        sys.executable, "-m", "airgossip", "baseline", "flower", str(FLOWER_APP),
        "--agents", "8", "--rounds", "5", "--out", str(ctx.work / "flower"),
    ]  # fmt: skip
    flower = run_watched(flower_cmd, log_path=ctx.work / "flower.log", env=env, cwd=ROOT)
    if flower.returncode != 0:
        raise RuntimeError(f"the Flower baseline failed (log {ctx.work / 'flower.log'})")
    print(f"  Flower simulation: {flower.wall_s:.1f} s wall, {flower.cpu_s:.1f} s CPU", flush=True)
    ratio = ours.wall_s / flower.wall_s
    figures.update(
        flower_wall_s=round(flower.wall_s, 2), flower_cpu_s=round(flower.cpu_s, 1),
        flower_peak_pss_mib=round(flower.peak_pss_bytes / 2**20), ratio=round(ratio, 3),
    )  # fmt: skip
    return [
        Outcome(
            "startup",
            "8 agents, digits, 5 rounds, processes over gRPC, start-up included: <= 1/3 of "
            "Flower's simulation engine (8 supernodes, 5 rounds)",
            f"ours {ours.wall_s:.1f} s / Flower {flower.wall_s:.1f} s = {ratio:.2f} "
            f"(CPU {ours.cpu_s:.0f} s vs {flower.cpu_s:.0f} s){_startup_note(figures)}",
            ratio <= 1 / 3,
            figures,
        )
    ]
