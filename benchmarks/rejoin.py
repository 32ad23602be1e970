"""Agents kill -9'd mid-run and restarted with the same command: the fleet's result survives.

    python -m benchmarks --only rejoin

Hand-started fleets as users run them on devices: ``airgossip coordinator`` and
``airgossip agent`` processes over mutual TLS, 10% loss, checkpoints every 2 s, each agent on
one thread. Each scenario runs the same seed as an undisturbed run, kills victims with
SIGKILL once the fleet is 40% through, and starts them again 12 s later with the same
command: from their newest checkpoint, from one written hundreds of rounds before (the
newer ones removed, as when the writer lags), or from none (the folder removed); and 4 of 16
agents at once. Reported: whether the coordinator wrote results, the final mean accuracy
against the undisturbed run's, refusals of non-finite values in any log, and, for
consensus, the relative error the restart left (the mass it cost the fleet's average).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from airgossip.common.security.certificates import throwaway_fleet
from airgossip.common.security.tls import COORDINATOR_IDENTITY
from airgossip.edge.observability.stats import read_records
from benchmarks.suite import Context, Outcome

SCENARIO = """\
agents = {agents}
rounds = {rounds}
seed = 11
eval_every = {eval_every}
wait_timeout_s = 0.25
[task]
{task}
[network]
loss = 0.1
"""
DIGITS = 'name = "digits"\nlocal_steps = 2'
CONSENSUS = 'name = "consensus"\ndim = 32'


@dataclass(frozen=True)
class Scenario:
    name: str
    agents: int
    rounds: int
    victims: tuple[int, ...]
    restart: str  # "newest", "old", "none", or "" (undisturbed)
    consensus: bool = False


@dataclass
class Result:
    scenario: Scenario
    written: bool
    accuracy: float | None
    min_accuracy: float | None
    relative_error: float | None
    non_finite: int
    notes: str
    seconds: float


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class HandStartedFleet:
    """A coordinator and agents started as a user would, each in its own process."""

    def __init__(self, folder: Path, scenario: Scenario) -> None:
        self.folder, self.scenario = folder, scenario
        folder.mkdir(parents=True)
        ids = [f"agent-{i}" for i in range(scenario.agents)]
        self.certs = throwaway_fleet(folder / "certs", [*ids, COORDINATOR_IDENTITY])
        self.config = folder / "scenario.toml"
        self.config.write_text(SCENARIO.format(
            agents=scenario.agents, rounds=scenario.rounds,
            eval_every=max(1, scenario.rounds // 40),
            task=CONSENSUS if scenario.consensus else DIGITS,
        ))  # fmt: skip
        self.port, self.metrics_port = free_port(), free_port()
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPC_VERBOSITY": "ERROR"}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.spawn("coordinator", [
            "coordinator", "--listen", f"127.0.0.1:{self.port}", "--metrics-port",
            str(self.metrics_port), "--config", str(self.config), "--topology", "exponential",
            "--certs", str(self.certs), "--out", str(folder / "run"),
            "--heartbeat-timeout-s", "60",  # victims are back long before: never declared dead
        ])  # fmt: skip
        for index in range(scenario.agents):
            self.start_agent(index)

    def spawn(self, name: str, args: list[str]) -> None:
        with (self.folder / f"{name}.log").open("ab") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "airgossip", *args], stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
            )  # fmt: skip

    def checkpoints(self, index: int) -> Path:
        return self.folder / "checkpoints" / f"agent-{index}"

    def start_agent(self, index: int) -> None:
        self.spawn(f"agent-{index}", [
            "agent", "--config", str(self.config), "--index", str(index),
            "--coordinator", f"127.0.0.1:{self.port}", "--certs", str(self.certs),
            "--stats-dir", str(self.folder / "stats"), "--threads", "1",
            "--checkpoint-dir", str(self.checkpoints(index)), "--checkpoint-interval-s", "2",
            "--linger-s", "300", "--parent-pid", str(os.getpid()),
        ])  # fmt: skip

    def kill(self, index: int) -> None:
        process = self.processes[f"agent-{index}"]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)

    def round_of(self, index: int) -> int:
        records = read_records(self.folder / "stats", f"agent-{index}")
        return records[-1].round if records else 0

    def fleet_round(self) -> int:
        rounds = sorted(self.round_of(i) for i in range(self.scenario.agents))
        return rounds[len(rounds) // 2]

    def results(self, timeout_s: float) -> dict[str, object] | None:
        path = self.folder / "run" / "results.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if path.exists():
                data: dict[str, object] = json.loads(path.read_text())
                return data
            if self.processes["coordinator"].poll() is not None:
                return None
            time.sleep(1.0)
        return None

    def wait(self, condition: Callable[[], bool], timeout_s: float) -> None:
        """Poll ``condition``; fail when it times out or a process of the fleet exits."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            dead = [n for n, p in self.processes.items() if p.poll() is not None]
            if dead:
                tail = (self.folder / f"{dead[0]}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{', '.join(dead)} exited early:\n{tail}")
            if time.monotonic() > deadline:
                raise TimeoutError("the fleet did not get there in time")
            time.sleep(0.5)

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
        for process in self.processes.values():
            process.wait(timeout=30)

    def non_finite_refusals(self) -> int:
        pattern = re.compile(r"NaN or infinit")
        return sum(
            len(pattern.findall(log.read_text(errors="replace")))
            for log in self.folder.glob("*.log")
        )

    def log_lines(self, index: int, pattern: str) -> list[str]:
        text = (self.folder / f"agent-{index}.log").read_text(errors="replace")
        return re.findall(pattern, text)


def checkpoint_round(folder: Path, certs: Path) -> int:
    """The round the newest checkpoint in ``folder`` holds (verified under the key of the
    agent whose folder it is, whatever run it names)."""
    from airgossip.edge.agent.checkpoints import (
        CheckpointError,
        CheckpointKey,
        CheckpointStore,
        decode_state,
    )

    key = CheckpointKey.of_private_key((certs / f"{folder.name}.key").read_bytes())
    for path in reversed(CheckpointStore(folder, folder.name, key=key).paths()):
        try:
            return int(decode_state(path.read_bytes(), key)["round"])
        except (OSError, CheckpointError):
            continue
    return -1


def run_scenario(work: Path, scenario: Scenario) -> Result:
    began = time.monotonic()
    fleet = HandStartedFleet(work / scenario.name, scenario)
    notes: list[str] = []
    try:
        kill_at = int(scenario.rounds * 0.4)
        early = max(1, kill_at - 700)  # the checkpoint kept is some 500 rounds old or more
        if scenario.restart == "old":
            fleet.wait(lambda: fleet.round_of(scenario.victims[0]) >= early, 900)
            time.sleep(2.5)  # at least one checkpoint written at or after `early`
            for index in scenario.victims:
                shutil.copytree(fleet.checkpoints(index), fleet.folder / f"old-{index}")
        if scenario.restart:
            fleet.wait(lambda: fleet.fleet_round() >= kill_at, 1800)
            for index in scenario.victims:
                fleet.kill(index)
            at = fleet.fleet_round()
            for index in scenario.victims:
                if scenario.restart == "old":
                    shutil.rmtree(fleet.checkpoints(index))
                    shutil.copytree(fleet.folder / f"old-{index}", fleet.checkpoints(index))
                elif scenario.restart == "none":
                    shutil.rmtree(fleet.checkpoints(index), ignore_errors=True)
            ages = [at - checkpoint_round(fleet.checkpoints(i), fleet.certs)
                    for i in scenario.victims if scenario.restart != "none"]  # fmt: skip
            time.sleep(12.0)
            for index in scenario.victims:
                fleet.start_agent(index)
            notes.append(f"killed at fleet round {at}")
            if ages:
                span = f"{min(ages)}" if min(ages) == max(ages) else f"{min(ages)} to {max(ages)}"
                notes.append(f"checkpoints {span} rounds older than the fleet")
        results = fleet.results(timeout_s=1800)
        for index in scenario.victims if scenario.restart else ():
            joined = fleet.log_lines(index, r"rejoining the fleet at round (\d+)")
            if joined:
                notes.append(f"agent-{index} rejoined at round {joined[-1]}")
        final = results.get("final") if results else None
        assert final is None or isinstance(final, dict)
        return Result(
            scenario, results is not None,
            final.get("mean_accuracy") if final else None,
            final.get("min_accuracy") if final else None,
            final.get("relative_error") if final else None,
            fleet.non_finite_refusals(), "; ".join(notes), time.monotonic() - began,
        )  # fmt: skip
    finally:
        fleet.close()


def scenarios(quick: bool) -> list[Scenario]:
    rounds = 1200 if quick else 3000
    small = [
        Scenario("undisturbed", 4, rounds, (), ""),
        Scenario("newest", 4, rounds, (1,), "newest"),
        Scenario("old", 4, rounds, (1,), "old"),
        Scenario("none", 4, rounds, (1,), "none"),
        Scenario("consensus-undisturbed", 4, rounds, (), "", consensus=True),
        Scenario("consensus-newest", 4, rounds, (1,), "newest", consensus=True),
        Scenario("consensus-old", 4, rounds, (1,), "old", consensus=True),
        Scenario("consensus-none", 4, rounds, (1,), "none", consensus=True),
    ]
    sixteen = 200 if quick else 600
    return [
        *small,
        Scenario("sixteen-undisturbed", 16, sixteen, (), ""),
        Scenario("sixteen-four", 16, sixteen, (2, 7, 11, 13), "newest"),
    ]


def figure(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def run(ctx: Context) -> list[Outcome]:
    results = []
    for scenario in scenarios(ctx.quick):
        print(f"  {scenario.name}", flush=True)
        results.append(run_scenario(ctx.work, scenario))
    base = {r.scenario.agents: r for r in results if not r.scenario.restart and not
            r.scenario.consensus}  # fmt: skip
    rows = [
        "| scenario | agents x rounds | results | mean acc (undisturbed) | min acc | "
        "relative error | non-finite refusals | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    met = True
    for r in results:
        s = r.scenario
        reference = base.get(s.agents)
        if s.consensus:
            accuracy = "-"
        else:
            accuracy = f"{figure(r.accuracy, '.4f')} ({figure(reference.accuracy, '.4f')})" if (
                reference) else figure(r.accuracy, ".4f")  # fmt: skip
            if s.restart and reference and reference.accuracy is not None:
                ok = r.accuracy is not None and r.accuracy >= 0.9 and abs(
                    r.accuracy - reference.accuracy) <= 0.02  # fmt: skip
                met = met and ok
        met = met and r.written and r.non_finite == 0
        rows.append(
            f"| {s.name} | {s.agents} x {s.rounds} | {'written' if r.written else 'NONE'} | "
            f"{accuracy} | {figure(r.min_accuracy, '.4f') if not s.consensus else '-'} | "
            f"{figure(r.relative_error, '.2e') if s.consensus else '-'} | {r.non_finite} | "
            f"{r.notes} ({r.seconds:.0f} s) |"
        )
    table = "\n".join(rows)
    return [Outcome(
        "rejoin",
        "kill -9 + restart (newest, old or no checkpoint; 4 of 16): results written, no "
        "non-finite value, accuracy >= 0.9 and within 0.02 of undisturbed",
        f"{sum(r.written for r in results)}/{len(results)} runs wrote results; "
        f"{sum(r.non_finite for r in results)} non-finite refusals",
        met, {"table": table, "runs": [
            {"scenario": r.scenario.name, "written": r.written, "accuracy": r.accuracy,
             "min_accuracy": r.min_accuracy, "relative_error": r.relative_error,
             "non_finite": r.non_finite, "notes": r.notes, "seconds": round(r.seconds, 1)}
            for r in results]},
    )]  # fmt: skip
