"""An insider's reports and heartbeats against a real coordinator process: statuses, memory,
database, and the run's results written all the same.

Run from the repository root (a few minutes on 2 cores)::

    python -m benchmarks.hostile_reports                   # 10,000 hostile reports
    python -m benchmarks.hostile_reports --reports 2000 --out hostile.md

``airgossip coordinator`` runs a consensus scenario of 4 agents of a 100-element model
(mutual TLS with a throwaway authority, ``--db`` in a private folder, heartbeats every
0.1 s, so its rate limit lets through 80 reports a second from one identity). An insider
holding agent-3's real certificate and its task (so its digest and estimate length are the
run's) registers and sends ``--reports`` Report calls that reach the coordinator's checks,
from 4 threads that back off whenever the coordinator says so: in turn 30 rounds with
4,096-element estimates (what broke the results before), 30 made-up rounds past the run
with the right estimates, a round of 2^63, a NaN estimate, 257 records in one call, rounds
gone back, and legal reports of made-up values (rounds forward within the run, then a call
overlapping the last one, again and again). Then it floods heartbeats and reports for 3 s
without backing off. Then the 4 real agents run the scenario to its end, and the
coordinator must write ``results.json``.

The report (markdown) gives: reports sent by kind and how each was answered (gRPC codes);
the coordinator's resident memory before the first hostile report, after each 1,000 and at
the end; the database's size (with its WAL) at the same points; what the floods got through
against their limits; and the results the run wrote. Every figure comes from the run that
prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np

from airgossip.common.security.certificates import throwaway_fleet
from airgossip.common.security.tls import COORDINATOR_IDENTITY, TlsCredentials, dial
from airgossip.coordinator.retry import retry_after
from airgossip.coordinator.run import REPORT_ESTIMATE_LIMIT, report_length
from airgossip.edge.agent import fleet_digest
from airgossip.edge.tasks import TaskContext, load_task
from airgossip.protos import coordinator_pb2, coordinator_pb2_grpc
from benchmarks.fuzz_fleet import free_port, status

AGENTS = 4
DIM = 100
SEED = 7
INSIDER = "agent-3"
SCENARIO = f"""\
agents = {AGENTS}
rounds = {{rounds}}
seed = {SEED}
wait_timeout_s = 0.25
[task]
name = "consensus"
dim = {DIM}
"""
KINDS = ("long estimates", "past the run", "round 2^63", "NaN", "257 records", "gone back",
         "forward, then overlapping")  # fmt: skip


def estimate(elements: int, value: float = 1.0) -> bytes:
    """``elements`` float64 values as a report carries them."""
    return np.full(elements, value, dtype="<f8").tobytes()


class Insider:
    """agent-3's certificate and task in an attacker's hands."""

    def __init__(self, address: str, certs: Path, rounds: int) -> None:
        self.rounds = rounds
        self.channel = dial(address, COORDINATOR_IDENTITY, TlsCredentials.load(certs, INSIDER))
        self.stub = coordinator_pb2_grpc.CoordinatorStub(self.channel)
        self.outcomes: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
        self.limited = 0
        self._lock = threading.Lock()
        #: Legal reports go one at a time, in order, as an agent's would.
        self._legal = threading.Lock()
        self._next = 0  # the next legal round

    def register(self) -> None:
        """Register as agent-3, with the run's digest and estimate length."""
        task = load_task("consensus", TaskContext(3, AGENTS, SEED, options={"dim": DIM}))
        initial = task.initial_parameters()
        self.stub.Register(
            coordinator_pb2.RegisterRequest(
                agent_id=INSIDER, address="127.0.0.1:1", fleet_digest=fleet_digest(task, initial),
                estimate_length=report_length(initial.numel()),
            ),
            timeout=10,
        )  # fmt: skip

    def payload(self, n: int) -> tuple[str, list[coordinator_pb2.RoundReport]]:
        """The ``n``-th hostile report: its kind and its records."""
        kind = KINDS[n % len(KINDS)]
        report = coordinator_pb2.RoundReport
        if kind == "long estimates":
            return kind, [
                report(round=r, estimate=estimate(REPORT_ESTIMATE_LIMIT)) for r in range(30)
            ]
        if kind == "past the run":
            return kind, [report(round=10_004_499 + r, estimate=estimate(DIM)) for r in range(30)]
        if kind == "round 2^63":
            return kind, [report(round=2**63, estimate=estimate(DIM))]
        if kind == "NaN":
            return kind, [report(round=1, estimate=estimate(DIM, float("nan")))]
        if kind == "257 records":
            return kind, [report(round=r % self.rounds) for r in range(257)]
        if kind == "gone back":
            return kind, [report(round=0, estimate=estimate(DIM))]
        # Legal calls of made-up values (1e6) forward through the run, then one call
        # overlapping the last again and again (not a retry: it starts elsewhere).
        with self._lock:
            first = min(self._next, self.rounds - 9)
            self._next = min(self._next + 10, self.rounds - 9)
        return kind, [report(round=r, wall_s=0.1, estimate=estimate(DIM, 1e6))
                      for r in range(first, first + 10)]  # fmt: skip

    def send(self, n: int) -> None:
        """One hostile report that reaches the checks (waiting out the rate limit)."""
        if KINDS[n % len(KINDS)] == KINDS[-1]:
            with self._legal:
                self._send(n)
        else:
            self._send(n)

    def _send(self, n: int) -> None:
        kind, rounds = self.payload(n)
        request = coordinator_pb2.ReportRequest(agent_id=INSIDER, rounds=rounds)
        while True:
            try:
                self.stub.Report(request, timeout=30)
                code = "OK"
            except grpc.RpcError as err:
                wait = retry_after(err)
                if wait is not None:
                    with self._lock:
                        self.limited += 1
                    time.sleep(wait)
                    continue
                code = err.code().name
            with self._lock:
                self.outcomes[kind][code] += 1
            return

    def flood(self, seconds: float) -> dict[str, Counter[str]]:
        """Heartbeats and reports flat out from 4 threads, never backing off."""
        calls = {
            "Heartbeat": (self.stub.Heartbeat, coordinator_pb2.HeartbeatRequest(agent_id=INSIDER)),
            "Report": (self.stub.Report, coordinator_pb2.ReportRequest(agent_id=INSIDER)),
        }
        counts: dict[str, Counter[str]] = {m: Counter() for m in calls}
        for method, (call, request) in calls.items():
            deadline = time.monotonic() + seconds
            with ThreadPoolExecutor(4) as pool:
                hammers = [pool.submit(hammer, call, request, deadline) for _ in range(4)]
                for done in hammers:
                    counts[method].update(done.result())
        return counts


def hammer(call: Callable[..., object], request: object, deadline: float) -> Counter[str]:
    """Call flat out until ``deadline``; count the answers by code."""
    seen: Counter[str] = Counter()
    while time.monotonic() < deadline:
        try:
            call(request, timeout=5)
            seen["OK"] += 1
        except grpc.RpcError as err:
            seen[err.code().name] += 1
    return seen


def db_bytes(db: Path) -> int:
    """The database's size with its WAL and shared memory."""
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


def main() -> None:
    """Run the measurement; print (and write) its report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=300, help="rounds of the run")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="airgossip-hostile-") as tmp:
        report = measure(Path(tmp), args)
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")


def measure(folder: Path, args: argparse.Namespace) -> str:
    """Start the coordinator, attack it, run the fleet to its end; the report."""
    ids = [f"agent-{i}" for i in range(AGENTS)]
    certs = throwaway_fleet(folder / "certs", [*ids, COORDINATOR_IDENTITY])
    scenario = folder / "scenario.toml"
    scenario.write_text(SCENARIO.format(rounds=args.rounds))
    db, results = folder / "state" / "fleet.db", folder / "run"
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPC_VERBOSITY": "ERROR"}
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, *argv: str) -> subprocess.Popen[bytes]:
        with (folder / f"{name}.log").open("wb") as log:
            process = subprocess.Popen([sys.executable, "-m", "airgossip", *argv], env=env,
                                       stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)  # fmt: skip
        processes.append(process)
        return process

    coordinator = spawn(
        "coordinator", "coordinator", "--listen", f"127.0.0.1:{port}", "--metrics-port",
        str(metrics_port), "--db", str(db), "--config", str(scenario), "--topology", "ring",
        "--certs", str(certs), "--out", str(results), "--heartbeat-interval-s", "0.1",
        "--heartbeat-timeout-s", "2",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/fleet", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or coordinator.poll() is not None:
                    raise SystemExit((folder / "coordinator.log").read_text()) from None
                time.sleep(0.2)
        insider = Insider(f"127.0.0.1:{port}", certs, args.rounds)
        insider.register()
        memory = [("before the first hostile report", status(coordinator.pid)[0], db_bytes(db))]
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            for start in range(0, args.reports, 1000):
                list(pool.map(insider.send, range(start, min(args.reports, start + 1000))))
                memory.append((f"after {min(args.reports, start + 1000):,}",
                               status(coordinator.pid)[0], db_bytes(db)))  # fmt: skip
        attack_s = time.monotonic() - started
        flood = insider.flood(3.0)
        memory.append(("after the floods", status(coordinator.pid)[0], db_bytes(db)))
        insider.channel.close()
        for index, agent_id in enumerate(ids):
            spawn(agent_id, "agent", "--coordinator", f"127.0.0.1:{port}", "--index",
                  str(index), "--certs", str(certs), "--threads", "1")  # fmt: skip
        coordinator.wait(timeout=600)
        written = results / "results.json"
        final = json.loads(written.read_text())["final"] if written.exists() else None
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return summarise(args, insider, attack_s, memory, flood, final, coordinator.returncode)


def summarise(
    args: argparse.Namespace,
    insider: Insider,
    attack_s: float,
    memory: list[tuple[str, float, int]],
    flood: dict[str, Counter[str]],
    final: dict[str, object] | None,
    returncode: int | None,
) -> str:
    """The report, in markdown."""
    load = os.getloadavg()
    lines = [
        f"## Hostile reports against a live coordinator ({AGENTS} agents of a {DIM}-element "
        f"model, {args.rounds} rounds, mutual TLS, --db)",
        "",
        f"{sum(sum(c.values()) for c in insider.outcomes.values()):,} hostile reports reached "
        f"the checks in {attack_s:.0f} s; {insider.limited:,} more were refused for their rate "
        f"first (RESOURCE_EXHAUSTED, sent again after the wait the coordinator named). "
        f"Load average {load[0]:.1f}.",
        "",
        "| report | answered |",
        "|---|---|",
    ]
    for kind, codes in insider.outcomes.items():
        lines.append(
            f"| {kind} | " + ", ".join(f"{c} {n:,}" for c, n in codes.most_common()) + " |"
        )
    lines += ["", "| when | coordinator RSS | fleet.db (+ WAL) |", "|---|---|---|"]
    lines += [f"| {when} | {rss:.1f} MB | {size / 1e6:.2f} MB |" for when, rss, size in memory]
    base = memory[0][1]
    lines += [
        "",
        f"RSS growth over the attack: {memory[-2][1] - base:+.1f} MB (peak "
        f"{max(m[1] for m in memory) - base:+.1f} MB); database at most "
        f"{max(m[2] for m in memory) / 1e6:.2f} MB.",
        "",
        "| flood (3 s, 4 threads, no back-off) | answered |",
        "|---|---|",
    ]
    for method, codes in flood.items():
        total = sum(codes.values())
        lines.append(f"| {method} | {total:,} calls: " + ", ".join(
            f"{c} {n:,}" for c, n in codes.most_common()) + " |")  # fmt: skip
    if final is None:
        lines += ["", f"**No results.json** (coordinator exit code {returncode})."]
    else:
        figures = {k: final.get(k) for k in ("round", "agents_reporting", "relative_error",
                                             "consensus_distance", "complete")}  # fmt: skip
        lines += ["", f"results.json written (coordinator exit code {returncode}): final "
                  + json.dumps(figures)]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
