"""A local fleet of real processes: a coordinator and agents started as users start them
(``python -m airgossip ...``), killed and restarted one by one (SIGKILL, as a crash would),
watched through the coordinator's ``/fleet`` and the agents' records."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from airgossip.edge.observability.stats import RoundRecord, read_records
from tests.support.cli import ROOT
from tests.support.processes import free_port
from tests.support.tls import credentials_folder

T = TypeVar("T")

SCENARIO = """\
agents = {agents}
rounds = 1000000
eval_every = 2
wait_timeout_s = 0.25
[task]
name = "digits"
local_steps = 5
[network]
loss = 0.1
"""


class LocalFleet:
    """Processes of one fleet; every one is killed when the test ends (see :meth:`close`)."""

    def __init__(
        self,
        tmp: Path,
        *,
        agents: int,
        topology: list[str],
        heartbeat_interval_s: float = 0.5,
        heartbeat_timeout_s: float = 4.0,
        token: str = "fleet-token",
        scenario: str | None = None,
        checkpoint_interval_s: float | None = None,
    ) -> None:
        self.tmp = tmp
        self.count = agents
        self.scenario = tmp / "scenario.toml"
        self.scenario.write_text(scenario or SCENARIO.format(agents=agents))
        #: Agents keep checkpoints (one folder each, kept across restarts) when set.
        self.checkpoint_interval_s = checkpoint_interval_s
        self.topology = topology
        self.interval = heartbeat_interval_s
        self.timeout = heartbeat_timeout_s
        self.token = token
        self.db = tmp / "fleet.db"
        #: Where the coordinator writes the run's results when every agent has finished.
        self.results_dir = tmp / "run"
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.agents: dict[int, subprocess.Popen[bytes]] = {}
        self.incarnation: dict[int, int] = {}
        self._spawned: list[subprocess.Popen[bytes]] = []

    # -- processes ---------------------------------------------------------------------------
    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        with (self.logs / log_name).open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "airgossip", *args],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env,
            )  # fmt: skip
        self._spawned.append(process)
        return process

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def start_coordinator(self) -> None:
        """Start the coordinator on its fixed ports and wait until it answers."""
        self.coordinator = self._spawn(
            [
                "coordinator", "--listen", f"127.0.0.1:{self.grpc_port}",
                "--metrics-port", str(self.metrics_port), "--db", str(self.db),
                "--out", str(self.results_dir),
                "--token", self.token, "--config", str(self.scenario), *self.topology,
                "--certs", str(credentials_folder()),
                "--heartbeat-interval-s", str(self.interval),
                "--heartbeat-timeout-s", str(self.timeout),
            ],
            "coordinator.log",
        )  # fmt: skip
        self.wait(lambda: self.fleet_or_none() is not None, 120, "the coordinator to answer")

    def kill_coordinator(self) -> float:
        assert self.coordinator is not None
        killed = time.time()
        self.coordinator.send_signal(signal.SIGKILL)
        self.coordinator.wait(timeout=30)
        return killed

    def stats_dir(self, index: int) -> Path:
        return self.tmp / "stats" / f"incarnation-{self.incarnation.get(index, 1)}"

    def start_agent(self, index: int) -> None:
        self.incarnation[index] = self.incarnation.get(index, 0) + 1
        self.agents[index] = self._spawn(
            [
                "agent", "--config", str(self.scenario), "--index", str(index),
                "--coordinator", f"127.0.0.1:{self.grpc_port}", "--token", self.token,
                "--stats-dir", str(self.stats_dir(index)), "--parent-pid", str(os.getpid()),
                "--threads", "1", "--certs", str(credentials_folder()),
                *self.checkpoint_args(index),
            ],
            f"agent-{index}.log",
        )  # fmt: skip

    def checkpoint_args(self, index: int) -> list[str]:
        if self.checkpoint_interval_s is None:
            return []
        return [
            "--checkpoint-dir", str(self.tmp / "checkpoints" / f"agent-{index}"),
            "--checkpoint-interval-s", str(self.checkpoint_interval_s), "--linger-s", "120",
        ]  # fmt: skip

    def kill_agent(self, index: int) -> float:
        killed = time.time()
        self.agents[index].send_signal(signal.SIGKILL)
        self.agents[index].wait(timeout=30)
        return killed

    def close(self) -> None:
        """Kill every process this fleet started (the test has made its checks; graceful
        shutdown is covered by the launcher's tests)."""
        for process in self._spawned:
            if process.poll() is None:
                process.kill()
        for process in self._spawned:
            process.wait(timeout=30)

    # -- observation -------------------------------------------------------------------------
    def fleet_or_none(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.metrics_url}/fleet", timeout=5) as reply:
                data: dict[str, Any] = json.loads(reply.read())
                return data
        except (OSError, ValueError):  # URLError is an OSError
            return None

    def fleet(self) -> dict[str, Any]:
        data = self.fleet_or_none()
        assert data is not None, "the coordinator does not answer"
        return data

    def members(self) -> dict[str, dict[str, Any]]:
        return {m["agent_id"]: m for m in self.fleet()["members"]}

    def records(self, index: int) -> list[RoundRecord]:
        return read_records(self.stats_dir(index), f"agent-{index}")

    def latest(self, index: int) -> RoundRecord | None:
        records = self.records(index)
        return records[-1] if records else None

    def round_of(self, index: int) -> int:
        latest = self.latest(index)
        return latest.round if latest else -1

    def accuracy(self, indices: list[int], last: int = 5) -> float:
        """Mean over ``indices`` of the median of each agent's last ``last`` test accuracies.

        A push-sum estimate is briefly noisy while an agent's weight is small; the median of a
        few reports measures where the agent is, not one unlucky round.
        """
        values = []
        for i in indices:
            recent = [r.metrics["accuracy"] for r in self.records(i) if "accuracy" in r.metrics]
            assert recent, f"agent-{i} has reported no accuracy yet"
            values.append(statistics.median(recent[-last:]))
        return sum(values) / len(values)

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join((self.logs / name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait(self, condition: Callable[[], T], timeout: float, what: str) -> T:
        """Poll ``condition`` until truthy; fail with the coordinator's log tail otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            for index, process in self.agents.items():
                code = process.poll()
                assert code is None or code == -signal.SIGKILL, (
                    f"agent-{index} exited with {code}:\n{self.log_tail(f'agent-{index}.log')}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:.0f} s waiting for {what}\n"
                    f"coordinator log:\n{self.log_tail('coordinator.log')}"
                )
