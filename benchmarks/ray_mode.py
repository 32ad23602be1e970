"""Ray mode beside process mode: 8 agents, digits, 10% loss, mutual TLS, the same run.

Each mode runs the same scenario through :func:`airgossip.emulation.fleets.run_fleet` in this
process (the CLI's import is left out of both): process mode forks its agents from a fork server;
ray mode starts a local Ray on loopback (no address given, as on a laptop), places 8 actors and
stops Ray at the end, all of it inside the figure. Measured from the launch: start-up (every agent
registered with the coordinator), time to 0.90 (the first moment the latest accuracy of every agent
averages 0.90 or more) and the whole run; beside them each agent's start-up CPU to serving, from its
log (a forked child in process mode; in ray mode the actor's worker process, which imports torch and
the agent itself). No speed target: the row says what Ray's start-up costs against processes, and
that the same agents learn as well.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

from benchmarks.suite import Context, Outcome

AGENTS = 8
TARGET_ACCURACY = 0.90


class Clock:
    """Seconds from the launch to start-up and to the target accuracy, from progress."""

    def __init__(self) -> None:
        self.launched = time.monotonic()
        self.startup_s: float | None = None
        self.target_s: float | None = None

    def __call__(self, progress: object) -> None:
        from airgossip.emulation.fleets import FleetProgress

        assert isinstance(progress, FleetProgress)
        now = time.monotonic() - self.launched
        if self.startup_s is None and progress.registered >= AGENTS:
            self.startup_s = now
        accuracy = progress.mean_accuracy
        if (
            self.target_s is None
            and progress.slowest_round >= 1
            and accuracy is not None
            and accuracy >= TARGET_ACCURACY
        ):
            self.target_s = now


def agent_startup_cpu(out: Path) -> float | None:
    """Mean CPU seconds of an agent's start-up to serving, from the agents' logs."""
    found = [
        float(m.group(1))
        for log in sorted((out / "logs").glob("agent-*.log"))
        if (m := re.search(r"start-up took ([0-9.]+) s of CPU", log.read_text()))
    ]
    return round(statistics.mean(found), 2) if found else None


def measure(mode: str, rounds: int, out: Path) -> dict[str, float | None]:
    """One run of ``mode``: start-up, time to 0.90, wall and final accuracy."""
    from airgossip.emulation.fleets import run_fleet
    from airgossip.scenario.config import load_config

    config = load_config(
        None, {"mode": mode, "agents": AGENTS, "rounds": rounds, "network": {"loss": 0.1}}
    )
    clock = Clock()
    results = run_fleet(config, out, on_progress=clock)
    wall = time.monotonic() - clock.launched
    final = results.final
    return {
        "startup_s": None if clock.startup_s is None else round(clock.startup_s, 2),
        "to_090_s": None if clock.target_s is None else round(clock.target_s, 2),
        "wall_s": round(wall, 2),
        "agent_startup_cpu_s": agent_startup_cpu(out),
        "accuracy": (
            None if final is None or final.mean_accuracy is None else round(final.mean_accuracy, 4)
        ),
    }


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def run(ctx: Context) -> list[Outcome]:
    from airgossip.emulation.fleets.ray_fleet import ray_available

    rounds = 15 if ctx.quick else 30
    if not ray_available():
        return [
            Outcome(
                "ray-mode", "start-up and time to 0.90, ray beside process mode",
                "not measured", None, note="Ray is not installed (pip install 'airgossip[ray]')",
            )
        ]  # fmt: skip
    figures: dict[str, object] = {"agents": AGENTS, "rounds": rounds}
    for mode in ("process", "ray"):
        figures[mode] = got = measure(mode, rounds, ctx.work / mode)
        print(
            f"  {mode}: start-up {_s(got['startup_s'])}, to 0.90 {_s(got['to_090_s'])}, "
            f"wall {_s(got['wall_s'])}, accuracy {got['accuracy']}, each agent's start-up "
            f"{got['agent_startup_cpu_s']} s of CPU",
            flush=True,
        )
    process, ray = figures["process"], figures["ray"]
    assert isinstance(process, dict) and isinstance(ray, dict)
    table = [
        "| mode | start-up | time to 0.90 | wall | final mean accuracy | agent start-up CPU |",
        "|---|---|---|---|---|---|",
    ]
    for mode, got in (("process", process), ("ray", ray)):
        table.append(
            f"| {mode} | {_s(got['startup_s'])} | {_s(got['to_090_s'])} | "
            f"{_s(got['wall_s'])} | {got['accuracy']} | {got['agent_startup_cpu_s']} s |"
        )
    figures["table"] = "\n".join(table)
    reached = process["to_090_s"] is not None and ray["to_090_s"] is not None
    ratio = f"{ray['to_090_s'] / process['to_090_s']:.1f}x" if reached else "n/a"
    return [
        Outcome(
            "ray-mode",
            f"{AGENTS} agents, digits, loss 0.1, mutual TLS: start-up and time to 0.90 in ray "
            "mode (a local Ray started cold) beside process mode; both reach 0.90",
            f"start-up ray {_s(ray['startup_s'])} / process {_s(process['startup_s'])}; to 0.90 "
            f"ray {_s(ray['to_090_s'])} / process {_s(process['to_090_s'])} ({ratio})",
            reached,
            figures,
        )
    ]
