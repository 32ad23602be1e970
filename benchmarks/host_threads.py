"""Agents that share a host do not oversubscribe it by default.

    python -m benchmarks --only host-threads

Four ``airgossip agent`` processes started by hand on this host, as a user tries a fleet on
one machine before the devices: static peers (no coordinator), plaintext gRPC on loopback,
digits on the exponential graph at 10% loss. The same fleet runs three times: with the
agents' default threads (nothing said), with ``--threads 1`` (the baseline) and with
``--threads <cores>`` (torch's own default, what every agent took before). Reported: the
fleet's rounds per second (each agent's rounds after its fifth over the time they took,
averaged over agents), default over ``--threads 1``; the goal is at least 1/1.5 of it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from airgossip.edge.observability.stats import read_records
from airgossip.node.threads import host_cores
from benchmarks.suite import Context, Outcome

AGENTS = 4
SCENARIO = """\
agents = {agents}
rounds = {rounds}
seed = 3
topology = "exponential"
[task]
name = "digits"
[network]
loss = 0.1
"""
#: Rounds each agent runs before its rate is taken (start-up and the fleet filling).
SKIP = 5
GOAL = 1.5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def fleet_rate(work: Path, rounds: int, threads: list[str]) -> float:
    """Rounds per second of a hand-started fleet whose agents get ``threads`` as flags."""
    work.mkdir(parents=True)
    ports = [_free_port() for _ in range(AGENTS)]
    peers = work / "peers.toml"
    peers.write_text(
        "[peers]\n" + "".join(f'agent-{i} = "127.0.0.1:{p}"\n' for i, p in enumerate(ports))
    )
    scenario = work / "scenario.toml"
    scenario.write_text(SCENARIO.format(agents=AGENTS, rounds=rounds))
    stats = work / "stats"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airgossip",
                "agent",
                "--config",
                str(scenario),
                "--index",
                str(i),
                "--listen",
                f"127.0.0.1:{port}",
                "--peers",
                str(peers),
                "--stats-dir",
                str(stats),
                "--linger-s",
                "3",
                "--insecure",
                "--parent-pid",
                str(os.getpid()),
                "--metrics-listen",
                "off",
                *threads,
            ],
            stdout=(work / f"agent-{i}.log").open("w"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        for i, port in enumerate(ports)
    ]
    try:
        for proc in procs:
            if proc.wait(timeout=600) != 0:
                raise RuntimeError(f"an agent failed: see {work}")
    finally:
        for proc in procs:
            proc.kill()
    rates = []
    for i in range(AGENTS):
        records = [r for r in read_records(stats, f"agent-{i}") if r.round >= SKIP]
        first, last = records[0], records[-1]
        rates.append((last.round - first.round) / (last.wall_s - first.wall_s))
    return sum(rates) / len(rates)


def run(ctx: Context) -> list[Outcome]:
    cores = host_cores()
    rounds = 40 if ctx.quick else 100
    started = time.perf_counter()
    default = fleet_rate(ctx.work / "default", rounds, [])
    one = fleet_rate(ctx.work / "threads-1", rounds, ["--threads", "1"])
    every = fleet_rate(ctx.work / f"threads-{cores}", rounds, ["--threads", str(cores)])
    ratio = one / default
    table = "\n".join([
        f"| threads of each of {AGENTS} agents on {cores} cores | fleet rounds/s |",
        "|---|---|",
        f"| default (nothing said) | {default:.1f} |",
        f"| `--threads 1` | {one:.1f} |",
        f"| `--threads {cores}` (torch's own default) | {every:.1f} |",
    ])  # fmt: skip
    return [
        Outcome(
            "host-threads",
            f"{AGENTS} hand-started agents, default threads: within {GOAL}x of the rounds/s "
            "of --threads 1",
            f"{default:.1f} rounds/s against {one:.1f} with --threads 1 ({ratio:.2f}x slower); "
            f"{every:.1f} with --threads {cores}",
            ratio <= GOAL,
            figures={
                "cores": cores,
                "rounds": rounds,
                "default": default,
                "threads_1": one,
                f"threads_{cores}": every,
                "ratio": ratio,
                "table": table,
                "seconds": round(time.perf_counter() - started, 1),
            },
            note="4 agents on one host; timings on a shared machine",
        )
    ]
