"""What tests share: the CLI in and out of process, real processes and ports, a local fleet
of real agent processes driven step by step, and a pure-algorithm fleet on a hostile network.

* :func:`cli`, :func:`airgossip`, :func:`assert_one_line_error`: the command line;
* :func:`free_port`, :func:`processes_mentioning`, :func:`wait_until_gone`, :func:`kill_all`:
  process hygiene;
* :class:`LocalFleet`: a coordinator and agents as OS processes that a test kills and
  restarts one by one (SIGKILL, as a crash would), watched through ``/fleet`` and the
  agents' records;
* :class:`AlgorithmFleet`: gossip algorithms with no agents and no transport, messages
  encoded as agents send them, on a network that loses, duplicates, reorders and drops
  acknowledgements from one seed;
* :func:`inproc_fleet`: a scenario's settings run by the project's own lock-step fleet
  (``inproc``), its agents kept for checks that need more than the records.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
import torch

from edge.agent import Agent, build_agent
from edge.agent.runner import WallClockRunner
from edge.algorithms import GossipAlgorithm, Payload, PushSum, algorithm_class, create_algorithm
from edge.compression import decode_blocks, get_codec, raw_codec_for
from edge.config.settings import AgentSettings
from edge.observability.stats import RoundRecord, read_records
from edge.observability.telemetry import ReceiveEvent, SendEvent, StepEvent
from edge.security.certificates import throwaway_fleet
from edge.security.tls import COORDINATOR_IDENTITY, TlsCredentials, dial, fleet_of
from edge.topology import Phase, assignments_for_graph, build_graph, node_phases
from edge.transport import GossipMessage
from edge.transport.grpc_transport import GrpcTransport
from edge.transport.wire import to_chunks
from emulation.config import load_config
from emulation.fleets import preflight
from emulation.fleets.inproc import InProcessFleet
from protos import gossip_pb2, gossip_pb2_grpc

# -- the command line and processes -------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def airgossip(
    *args: str, timeout: float = 240, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI as users do (``python -m airgossip``) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "airgossip", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line contains ``text`` (zombies excluded)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def wait_until_gone(text: str, timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = processes_mentioning(text)
        if not alive:
            return []
        time.sleep(0.2)
    return processes_mentioning(text)


def kill_all(text: str) -> None:
    for pid in processes_mentioning(text):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli(*args: str) -> Any:
    """The CLI in this process (fast); subprocess runs cover the real entry point."""
    from typer.testing import CliRunner

    from airgossip.cli import app

    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    result.returncode = result.exit_code
    return result


def assert_one_line_error(result: Any, *fragments: str) -> None:
    """A bad input was refused with exit code 2 and one line naming what was wrong."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# -- a local fleet of real processes ------------------------------------------------------------

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
            time.sleep(0.2)


# -- algorithms on a hostile network, no agents -------------------------------------------------

#: Called once per agent and round before sharing: (agent index, algorithm).
LocalStep = Callable[[int, GossipAlgorithm], None]


@dataclass
class AlgorithmFleet:
    algos: list[GossipAlgorithm]
    phases: list[list[Phase]]
    ids: list[str]
    round: int = 0

    @classmethod
    def build(
        cls,
        name: str,
        n: int,
        *,
        topology: str = "exponential",
        dim: int = 20,
        seed: int = 0,
        compression: str = "none",
        options: Mapping[str, Any] | None = None,
        initial: list[torch.Tensor] | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> AlgorithmFleet:
        gen = torch.Generator().manual_seed(seed)
        ids = [f"a{i}" for i in range(n)]
        graph = build_graph(topology, n)
        codec = raw_codec_for(dtype) if compression == "none" else get_codec(compression)
        starts = initial or [torch.randn(dim, generator=gen, dtype=dtype) + 1 for _ in ids]
        algos = [
            create_algorithm(name, start, dtype=dtype, codec=codec, seed=i, options=options)
            for i, start in enumerate(starts)
        ]
        scheme = algorithm_class(name).mixing
        return cls(algos, [node_phases(graph, ids, i, scheme) for i in range(n)], ids)

    def average(self) -> torch.Tensor:
        return sum(a.estimate() for a in self.algos) / len(self.algos)  # type: ignore[return-value]

    def error(self, target: torch.Tensor) -> float:
        return max(float((a.estimate() - target).norm() / target.norm()) for a in self.algos)

    def total_x(self) -> torch.Tensor:
        """Sum of ``x`` held by the agents (unmixed mass included, nothing on the wire)."""
        return sum(a.mass()[0] for a in self.algos)  # type: ignore[attr-defined,return-value]

    def deliver(self, sender: int, receiver: int, payload: Payload) -> Any:
        algo = self.algos[receiver]
        encoded = payload.encoded
        if encoded is None:  # an algorithm that leaves encoding to the agent
            encoded = algo.codec.encode(payload.vector)
        vector = decode_blocks(get_codec(encoded.codec), encoded, algo.block_numel, algo.dtype)
        wire = Payload(vector, dict(payload.scalars), payload.seq, payload.base_seq)
        return algo.receive(self.ids[sender], wire)

    def run(
        self,
        rounds: int,
        *,
        loss: float = 0.0,
        duplicate: float = 0.0,
        max_delay: int = 0,
        ack_loss: float = 0.0,
        seed: int = 0,
        local_step: LocalStep | None = None,
        after_round: Callable[[AlgorithmFleet], None] | None = None,
    ) -> None:
        rng = random.Random(seed)
        queue: list[tuple[int, int, int, Payload]] = []  # (due round, sender, receiver, payload)
        everyone = set(self.ids)
        for _ in range(rounds):
            r = self.round = self.round + 1
            for i, algo in enumerate(self.algos):
                if local_step is not None:
                    local_step(i, algo)
                phase = algo.schedule(r, self.phases[i][r % len(self.phases[i])])
                for peer, payload in algo.share(phase, everyone - {self.ids[i]}).items():
                    copies = 0 if rng.random() < loss else 1 + (rng.random() < duplicate)
                    for _ in range(copies):
                        due = r + rng.randint(0, max_delay)
                        queue.append((due, i, self.ids.index(peer), payload))
            rng.shuffle(queue)
            due_now = [m for m in queue if m[0] <= r]
            queue = [m for m in queue if m[0] > r]
            for _, i, j, payload in due_now:
                ack = self.deliver(i, j, payload)
                if rng.random() >= ack_loss:
                    self.algos[i].on_ack(self.ids[j], ack)
            for algo in self.algos:
                algo.mix()
            if after_round is not None:
                after_round(self)


# -- whole fleets of real agents, in lock step --------------------------------------------------


def inproc_fleet(**settings: Any) -> InProcessFleet:
    """Run ``settings`` (a scenario's keys: agents, topology, task, network, switching...) in
    ``inproc`` mode, the lock-step fleet every in-process run uses, and return it finished:
    its records (``fleet.records()``, for :func:`emulation.results.summarise`) and its agents
    (algorithms, tasks, assignments) for checks that need more than the records.

    ``[network]`` defaults as in a scenario (10% loss): give ``network={"loss": 0.0}`` for
    lossless links.
    """
    config = load_config(None, {"mode": "inproc", **settings})
    fleet = InProcessFleet(config, preflight(config).network)
    fleet.run()
    return fleet


# -- helpers of one layer's tests that others share ---------------------------------------------


class FakeClock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """An agent observer that keeps every event."""

    def __init__(self) -> None:
        self.events: list[object] = []

    def on_send(self, event: SendEvent) -> None:
        self.events.append(event)

    def on_step(self, event: StepEvent) -> None:
        self.events.append(event)

    def on_receive(self, event: ReceiveEvent) -> None:
        self.events.append(event)


def promtool_check(text: str) -> None:
    """`promtool check metrics` must accept the exposition without a single lint remark."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `./scripts/install --dev` installs Debian's prometheus"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )


#: Identities the tests' certificate authority has certificates for.
TEST_IDENTITIES = (*(f"agent-{i}" for i in range(16)), COORDINATOR_IDENTITY, "mallory")


@functools.cache
def credentials_folder() -> Path:
    """One throwaway CA for the whole test session, with a certificate for each of
    :data:`TEST_IDENTITIES` (the folder is removed when the session ends)."""
    folder = Path(tempfile.mkdtemp(prefix="airgossip-test-certs-"))
    atexit.register(shutil.rmtree, folder, True)
    return throwaway_fleet(folder, TEST_IDENTITIES)


def credentials(identity: str) -> TlsCredentials:
    """The test CA's credentials of ``identity``."""
    return TlsCredentials.load(credentials_folder(), identity)


def grpc_pair(settings: AgentSettings, *, secure: bool = True) -> Iterator[tuple[Agent, Agent]]:
    """Two agents serving real gRPC (mutual TLS unless ``secure`` is False) on loopback,
    neighbours of each other (fixture body)."""
    security = {f"agent-{i}": credentials(f"agent-{i}") if secure else None for i in range(2)}
    agents = [
        build_agent(a, index=i, num_agents=2, settings=settings, fleet=fleet_of(security[a]),
                    transport=GrpcTransport(a, security=security[a]))
        for i, a in enumerate(security)
    ]  # fmt: skip
    addresses = {a.agent_id: a.start() for a in agents}
    assignments = assignments_for_graph(build_graph("complete", 2), addresses)
    for agent in agents:
        agent.set_assignment(assignments[agent.agent_id])
    yield agents[0], agents[1]
    for agent in agents:
        agent.close()


def assert_pair_reaches_average(pair: tuple[Agent, Agent], timeout_s: float) -> None:
    """Run both agents to the end; each must hold the average of their vectors (1e-8), having
    refused nothing."""
    a, b = pair
    target = (a.task.initial_parameters() + b.task.initial_parameters()) / 2
    threads = [threading.Thread(target=WallClockRunner(agent).run) for agent in pair]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    assert not any(t.is_alive() for t in threads)
    for agent in pair:
        error = (agent.algorithm.estimate() - target).norm() / target.norm()
        assert float(error) < 1e-8
        assert agent.counters().messages_rejected == 0


def agent_channel(agent: Agent, identity: str | None = None) -> grpc.Channel:
    """A channel to ``agent`` as the transport would dial it: with TLS (if the agent serves
    it) under the certificate of ``identity`` (default: the agent's first in-neighbour)."""
    if getattr(agent.transport, "security", None) is None:
        return grpc.insecure_channel(agent.address)
    if identity is None:
        identity = next(iter(agent.assignment.phase(1).in_neighbours))  # type: ignore[union-attr]
    return dial(agent.address, agent.agent_id, credentials(identity))


def push(
    agent: Agent, message: GossipMessage, *, identity: str | None = None
) -> gossip_pb2.PushAck:
    """Push ``message`` to ``agent`` over a fresh channel, with the certificate of
    ``identity`` (default: the message's sender)."""
    with agent_channel(agent, identity or message.header.sender) as channel:
        return gossip_pb2_grpc.GossipStub(channel).Push(to_chunks(message, 16), timeout=5)


def refused(agent: Agent, message: GossipMessage, *, identity: str | None = None) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        push(agent, message, identity=identity)
    return info.value


@dataclass
class PushSumFleet:
    """Pure-algorithm fleet with a hostile network: loss, duplicates, reordering, late acks."""

    algos: list[PushSum]
    phases: list[list[Phase]]
    ids: list[str]

    @classmethod
    def build(cls, n: int, topology: str = "exponential", dim: int = 20, seed: int = 0,
              algorithm: type[PushSum] = PushSum) -> PushSumFleet:  # fmt: skip
        gen = torch.Generator().manual_seed(seed)
        ids = [f"a{i}" for i in range(n)]
        graph = build_graph(topology, n)
        algos = [algorithm(torch.randn(dim, generator=gen, dtype=torch.float64) + 1) for _ in ids]
        return cls(algos, [node_phases(graph, ids, i) for i in range(n)], ids)

    def average(self) -> torch.Tensor:
        total_x = sum(a.x for a in self.algos)
        return total_x / len(self.algos)

    def total_mass(self) -> tuple[torch.Tensor, float]:
        """Mass held by agents plus mass still on the edges."""
        x = sum(a.mass()[0] for a in self.algos)
        y = sum(a.mass()[1] for a in self.algos)
        for i, sender in enumerate(self.algos):
            for j, receiver in enumerate(self.algos):
                if i == j:
                    continue
                sx, sy, sbase = sender.out_edge_sum(self.ids[j])
                rx, ry, rbase = receiver.in_edge_sum(self.ids[i])
                if rbase == sbase:
                    sx, sy = sx - rx, sy - ry
                x, y = x + sx, y + sy
        return x, y

    def error(self, target: torch.Tensor) -> float:
        return max(float((a.estimate() - target).norm() / target.norm()) for a in self.algos)


def run_push_sum(fleet: PushSumFleet, rounds: int, *, loss: float = 0.0, duplicate: float = 0.0,
        max_delay: int = 0, ack_loss: float = 0.0, seed: int = 0,
        check_mass: torch.Tensor | None = None) -> None:  # fmt: skip
    """Every round each agent shares with all out-neighbours; messages may be lost,
    duplicated, or delivered up to ``max_delay`` rounds late (so out of order)."""
    rng = random.Random(seed)
    queue: list[tuple[int, int, int, Payload]] = []  # (due round, sender, receiver, payload)
    n = len(fleet.algos)
    for r in range(rounds):
        for i, algo in enumerate(fleet.algos):
            phase = fleet.phases[i][r % len(fleet.phases[i])]
            for peer, payload in algo.share(phase, set(phase.out_weights)).items():
                copies = 0 if rng.random() < loss else 1 + (rng.random() < duplicate)
                for _ in range(copies):
                    queue.append((r + rng.randint(0, max_delay), i, fleet.ids.index(peer), payload))
        rng.shuffle(queue)
        due, queue = [m for m in queue if m[0] <= r], [m for m in queue if m[0] > r]
        for _, i, j, payload in due:
            ack = fleet.algos[j].receive(fleet.ids[i], payload)
            if rng.random() >= ack_loss:
                fleet.algos[i].on_ack(fleet.ids[j], ack)
        for algo in fleet.algos:
            algo.mix()
        if check_mass is not None:
            x, y = fleet.total_mass()
            torch.testing.assert_close(x, check_mass, rtol=0, atol=1e-10)
            assert y == pytest.approx(n, abs=1e-10)


class TlsFleet:
    """A consensus fleet of agents in this process, each serving real gRPC with mutual TLS
    (the test CA's certificates), on the exponential graph. Tests attack it, then
    :meth:`run_to_end` and check :meth:`relative_error`."""

    def __init__(self, n: int = 4, *, rounds: int = 60, dim: int = 8, seed: int = 5) -> None:
        from edge.config.settings import TaskSettings

        self.settings = AgentSettings(
            task=TaskSettings(name="consensus", dim=dim), rounds=rounds, wait_timeout_s=0.5,
            seed=seed,
        )  # fmt: skip
        self.dim = dim
        self.ids = [f"agent-{i}" for i in range(n)]
        self.agents: list[Agent] = []
        for i, agent_id in enumerate(self.ids):
            security = credentials(agent_id)
            transport = GrpcTransport(agent_id, security=security)
            self.agents.append(
                build_agent(agent_id, index=i, num_agents=n, settings=self.settings,
                            transport=transport, fleet=fleet_of(security))
            )  # fmt: skip
        addresses = {a.agent_id: a.start() for a in self.agents}
        assignments = assignments_for_graph(build_graph("exponential", n), addresses)
        for agent in self.agents:
            agent.set_assignment(assignments[agent.agent_id])

    def __getitem__(self, agent_id: str) -> Agent:
        return self.agents[self.ids.index(agent_id)]

    def start_running(self) -> None:
        """Run every agent in a thread of its own (see :meth:`join`)."""
        self._threads = [
            threading.Thread(target=WallClockRunner(a).run, daemon=True) for a in self.agents
        ]
        for thread in self._threads:
            thread.start()

    def join(self, timeout_s: float = 120) -> None:
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        assert not any(t.is_alive() for t in self._threads), "the fleet did not finish in time"

    def run_to_end(self, timeout_s: float = 120) -> None:
        self.start_running()
        self.join(timeout_s)

    def relative_error(self) -> float:
        """Largest relative error of an agent's estimate against the exact average."""
        from edge.tasks.consensus import ConsensusOptions, true_average

        target = true_average(self.settings.seed, len(self.ids), ConsensusOptions(dim=self.dim))
        return max(
            float((a.algorithm.estimate() - target).norm() / target.norm()) for a in self.agents
        )

    def close(self) -> None:
        for agent in self.agents:
            agent.close()
