"""Fleet launchers: N agents as OS processes over real gRPC, or all in one process.

Both modes build every agent with :func:`edge.agent.build_agent` and run the same phases; the
process mode runs ``airgossip agent`` once per agent beside an embedded coordinator, the
in-process mode drives agents in lock step over the in-memory transport (deterministic for
a seed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coordinator.service import CoordinatorServer, TopologySpec
from edge.agent import build_agent
from edge.algorithms import algorithm_class
from edge.settings import resolve_device
from edge.stats import MemoryStatsSink, RoundRecord, read_records
from edge.tasks import TaskContext, TaskError, load_task
from edge.tasks.consensus import ConsensusOptions, true_average
from edge.topology import (
    Graph,
    TopologyError,
    assignments_for_graph,
    build_graph,
    mixing_matrices,
    second_largest_eigenvalue,
)
from edge.transport import InMemoryNetwork, InMemoryTransport
from emulation.config import ConfigError, RunConfig
from emulation.results import plot_results, summarise, write_results
from emulation.virtual import VirtualFleet
from emulation.wireless_fleet import check_wireless, finish_results, wireless_resolved, with_epoch

#: Seconds without any agent progress after which a process fleet is declared stuck.
STALL_TIMEOUT_S = 180.0


class FleetError(RuntimeError):
    """A fleet that could not run to the end (an agent crashed, nothing progressed...)."""


@dataclass(frozen=True)
class FleetProgress:
    """A snapshot for progress displays."""

    agents: int
    rounds_total: int
    registered: int = 0
    slowest_round: int = 0
    fastest_round: int = 0
    agents_done: int = 0
    mean_accuracy: float | None = None
    messages_sent: int = 0
    messages_dropped: int = 0


ProgressCallback = Callable[[FleetProgress], None]


def agent_ids(count: int) -> list[str]:
    return [f"agent-{i}" for i in range(count)]


def topology_spec(config: RunConfig) -> TopologySpec:
    return TopologySpec(
        # Wireless: every agent learns every address; the graph comes from the channel model.
        name="complete" if config.wireless is not None else config.topology,
        seed=config.seed,
        edges=tuple(tuple(e) for e in config.edges or ()),  # type: ignore[misc]
        p=config.edge_probability,
        scheme=algorithm_class(config.algorithm).mixing,
    )


def fleet_graph(config: RunConfig) -> Graph:
    spec = topology_spec(config)
    try:
        return build_graph(
            spec.name, config.agents, seed=spec.seed, edges=list(spec.edges) or None, p=spec.p
        )
    except TopologyError as err:
        raise ConfigError(str(err)) from None


def preflight(config: RunConfig) -> Graph:
    """Check everything that can be checked before any agent starts; return the graph."""
    graph = check_wireless(config) or fleet_graph(config)
    check_graph_fits(config, graph)
    try:
        device = resolve_device(config.device)
        settings = config.agent_settings()
        load_task(
            settings.task.name,
            TaskContext(0, config.agents, config.seed, device, settings.task.options),
        )
    except (TaskError, ValueError) as err:
        raise ConfigError(str(err)) from None
    return graph


def check_graph_fits(config: RunConfig, graph: Graph) -> None:
    """:class:`ConfigError` when the algorithm cannot run on the graph (dpsgd on a directed
    one, say)."""
    algorithm = algorithm_class(config.algorithm)
    if not algorithm.supports_directed and not graph.is_undirected:
        raise ConfigError(
            f"algorithm '{config.algorithm}' needs an undirected graph; topology "
            f"'{config.topology}' is directed (use ring, complete, or a symmetric edge list)"
        )


def reference_answer(config: RunConfig) -> np.ndarray | None:
    """The exact average for ``consensus`` runs, computed independently of the agents."""
    if config.task.name != "consensus":
        return None
    options = ConsensusOptions.model_validate(config.task.options)
    return true_average(config.seed, config.agents, options).numpy()


def _progress(
    config: RunConfig, latest: dict[str, dict[str, Any]], registered: int
) -> FleetProgress:
    rounds = [r["round"] for r in latest.values()] or [0]
    accuracies = [r["metrics"]["accuracy"] for r in latest.values() if "accuracy" in r["metrics"]]
    return FleetProgress(
        agents=config.agents,
        rounds_total=config.rounds,
        registered=registered,
        slowest_round=min(rounds) if len(latest) == config.agents else 0,
        fastest_round=max(rounds),
        agents_done=sum(1 for r in latest.values() if r.get("final")),
        mean_accuracy=float(np.mean(accuracies)) if accuracies else None,
        messages_sent=sum(r["messages_sent"] for r in latest.values()),
        messages_dropped=sum(r["messages_dropped"] + r["messages_failed"] for r in latest.values()),
    )


class InProcessFleet:
    """All agents in this process, driven in lock step over the in-memory transport."""

    def __init__(self, config: RunConfig, on_progress: ProgressCallback | None = None) -> None:
        self.config = config
        self.on_progress = on_progress
        self.sink = MemoryStatsSink()

    def run(self) -> dict[str, list[RoundRecord]]:
        config = self.config
        settings = config.agent_settings()
        network = InMemoryNetwork()
        shaper = config.network.shaper(config.seed)
        ids = agent_ids(config.agents)
        agents = [
            build_agent(
                agent_id,
                index=i,
                num_agents=config.agents,
                settings=settings,
                transport=InMemoryTransport(network, agent_id, shaper=shaper),
                stats=self.sink,
            )
            for i, agent_id in enumerate(ids)
        ]
        addresses = {a.agent_id: a.start() for a in agents}
        assignments = assignments_for_graph(
            fleet_graph(config), addresses, scheme=algorithm_class(config.algorithm).mixing
        )
        for agent in agents:
            agent.set_assignment(assignments[agent.agent_id])
            agent.begin()
        grad = torch.is_grad_enabled()
        torch.set_grad_enabled(False)  # gossip needs no autograd (training re-enables it)
        try:
            for round_index in range(1, config.rounds + 1):
                for agent in agents:
                    agent.local_step(round_index)
                    agent.push(round_index)
                for agent in agents:
                    agent.mix(round_index)
                    if agent._due(round_index):
                        agent.report(round_index)
                if self.on_progress is not None:
                    latest = {
                        a.agent_id: {
                            "round": round_index,
                            "final": round_index == config.rounds,
                            "metrics": {},
                            **a.counters(),
                        }
                        for a in agents
                    }
                    accuracy = self._latest_accuracy(round_index)
                    progress = _progress(config, latest, config.agents)
                    self.on_progress(FleetProgress(**{**vars(progress), "mean_accuracy": accuracy}))
        finally:
            torch.set_grad_enabled(grad)
            for agent in agents:
                agent.close()
        return self.records()

    def _latest_accuracy(self, round_index: int) -> float | None:
        values = [
            r.metrics["accuracy"]
            for r in self.sink.records
            if r.round == round_index and "accuracy" in r.metrics
        ]
        return float(np.mean(values)) if values else None

    def records(self) -> dict[str, list[RoundRecord]]:
        out: dict[str, list[RoundRecord]] = {}
        for record in self.sink.records:
            out.setdefault(record.agent_id, []).append(record)
        return out


class _JsonTail:
    """Reads the complete lines appended to a JSON-lines file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        return [json.loads(line) for line in chunk[: end + 1].splitlines() if line.strip()]


@dataclass
class _AgentProcess:
    agent_id: str
    process: subprocess.Popen[bytes]
    log_path: Path
    tail: _JsonTail
    latest: dict[str, Any] = field(default_factory=dict)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])


class ProcessFleet:
    """One ``airgossip agent`` OS process per agent, an embedded coordinator, real gRPC."""

    def __init__(
        self,
        config: RunConfig,
        out_dir: Path,
        *,
        config_path: Path,
        on_progress: ProgressCallback | None = None,
        coordinator_listen: str = "127.0.0.1:0",
        coordinator_metrics_listen: str | None = None,
    ) -> None:
        self.config = config
        self.out_dir = out_dir
        self.config_path = config_path
        self.on_progress = on_progress
        self.coordinator_listen = coordinator_listen
        self.coordinator_metrics_listen = coordinator_metrics_listen
        self.stats_dir = out_dir / "agents"
        self.logs_dir = out_dir / "logs"
        self.processes: list[_AgentProcess] = []

    def _spawn(self, index: int, agent_id: str, coordinator: str) -> _AgentProcess:
        return self._launch(index, agent_id, ["--coordinator", coordinator])

    def _launch(
        self, index: int, agent_id: str, peering: list[str], prefix: Sequence[str] = ()
    ) -> _AgentProcess:
        """Start one agent process; ``peering`` says how it finds its neighbours
        (``--coordinator`` or ``--listen`` and ``--peers``), ``prefix`` wraps the command
        (``ip netns exec``)."""
        log_path = self.logs_dir / f"{agent_id}.log"
        command = [
            *prefix,
            sys.executable, "-m", "airgossip", "agent",
            "--config", str(self.config_path),
            "--id", agent_id,
            "--index", str(index),
            *peering,
            "--stats-dir", str(self.stats_dir),
            "--parent-pid", str(os.getpid()),
            "--linger-s", "3600",
            "--threads", "1",
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the launcher only; it stops agents
                cwd=os.getcwd(),
            )
        return _AgentProcess(
            agent_id, process, log_path, _JsonTail(self.stats_dir / f"{agent_id}.jsonl")
        )

    def run(self) -> dict[str, list[RoundRecord]]:
        config = self.config
        self.stats_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        server = CoordinatorServer(
            expected=config.agents,
            topology=topology_spec(config),
            listen=self.coordinator_listen,
            metrics_listen=self.coordinator_metrics_listen,
        )
        address = server.start()
        try:
            self.processes = [
                self._spawn(i, agent_id, address)
                for i, agent_id in enumerate(agent_ids(config.agents))
            ]
            self._monitor(server.fleet.registered)
        finally:
            self.stop_agents()
            server.stop(grace_s=0.5)
        return {p.agent_id: read_records(self.stats_dir, p.agent_id) for p in self.processes}

    def _monitor(self, registered_count: Callable[[], int]) -> None:
        last_change = time.monotonic()
        last_state: tuple[int, ...] = ()
        while True:
            for agent in self.processes:
                for record in agent.tail.read():
                    agent.latest = record
            done = sum(1 for a in self.processes if a.latest.get("final"))
            for agent in self.processes:
                code = agent.process.poll()
                if code is not None and not agent.latest.get("final"):
                    raise FleetError(
                        f"{agent.agent_id} exited with code {code} before finishing: "
                        f"{agent.log_tail() or 'no output'} (log: {agent.log_path})"
                    )
            registered = registered_count()
            latest = {a.agent_id: a.latest for a in self.processes if a.latest}
            if self.on_progress is not None:
                self.on_progress(_progress(self.config, latest, registered))
            if done == len(self.processes):
                return
            state = (registered, *(a.latest.get("round", -1) for a in self.processes))
            if state != last_state:
                last_state, last_change = state, time.monotonic()
            elif time.monotonic() - last_change > STALL_TIMEOUT_S:
                raise FleetError(
                    f"no agent made progress for {STALL_TIMEOUT_S:.0f} s; see {self.logs_dir}"
                )
            time.sleep(0.1)

    def stop_agents(self, grace_s: float = 5.0) -> None:
        """SIGTERM every agent, then SIGKILL those still alive after ``grace_s``."""
        for agent in self.processes:
            if agent.process.poll() is None:
                agent.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for agent in self.processes:
            try:
                agent.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                agent.process.kill()
                agent.process.wait()


def _records(config: RunConfig) -> bool:
    return config.wireless is not None and config.wireless.record


def _round_progress(
    config: RunConfig, on_progress: ProgressCallback | None
) -> Callable[[int, list[Any]], None] | None:
    """Progress of an event-driven fleet, reported whenever its slowest agent advances."""
    if on_progress is None:
        return None

    def on_round(slowest: int, agents: list[Any]) -> None:
        latest = {
            a.agent_id: {"round": slowest, "final": slowest == config.rounds, "metrics": {},
                         **a.counters()}
            for a in agents
        }  # fmt: skip
        on_progress(_progress(config, latest, config.agents))

    return on_round


def resolved_config(config: RunConfig, graph: Graph) -> dict[str, Any]:
    data = config.model_dump(mode="json")
    scheme = algorithm_class(config.algorithm).mixing
    data["lambda2"] = second_largest_eigenvalue(mixing_matrices(graph, scheme))
    data["topology_period"] = graph.period
    data["edges_per_round"] = graph.edge_count() / graph.period
    return data


#: What a run leaves in its output folder: a second run there would mix the two.
RUN_OUTPUTS = ("results.json", "agents", "logs")


def refuse_used_out_dir(out_dir: Path) -> None:
    """``ConfigError`` if ``out_dir`` already holds a run's results or agent files."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"output folder {out_dir} exists and is not a folder")
    used = [name for name in RUN_OUTPUTS if (out_dir / name).exists()]
    if used:
        raise ConfigError(
            f"output folder {out_dir} already holds a run ({', '.join(used)}); "
            "choose a new --out or remove it"
        )


def run_fleet(
    config: RunConfig,
    out_dir: Path,
    *,
    on_progress: ProgressCallback | None = None,
    coordinator_listen: str = "127.0.0.1:0",
    coordinator_metrics_listen: str | None = None,
) -> dict[str, Any]:
    """Run a fleet to the end; write ``results.json`` and ``results.png`` into ``out_dir``.

    On Ctrl-C the agents are stopped, whatever was recorded so far is written with
    ``"interrupted": true``, and ``KeyboardInterrupt`` propagates.
    """
    graph = preflight(config)
    config = with_epoch(config)
    refuse_used_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if config.wireless is not None:
        resolved = wireless_resolved(config, graph)
    else:
        resolved = resolved_config(config, graph)
    config_path = out_dir / "config.json"
    config_path.write_text(json.dumps(config.model_dump(mode="json"), indent=2) + "\n")
    started = time.monotonic()
    fleet: InProcessFleet | ProcessFleet | VirtualFleet
    if config.mode == "inproc" and config.wireless is None:
        fleet = InProcessFleet(config, on_progress)
    elif config.mode in ("inproc", "virtual"):
        fleet = VirtualFleet(config, _round_progress(config, on_progress), journal=_records(config))
    elif config.mode == "namespaces":
        from emulation.kernel import NamespaceFleet

        fleet = NamespaceFleet(config, out_dir, config_path=config_path, on_progress=on_progress)
    else:
        fleet = ProcessFleet(
            config,
            out_dir,
            config_path=config_path,
            on_progress=on_progress,
            coordinator_listen=coordinator_listen,
            coordinator_metrics_listen=coordinator_metrics_listen,
        )
    interrupted = False
    try:
        records = fleet.run()
    except KeyboardInterrupt:
        interrupted = True
        records = (
            fleet.records()
            if isinstance(fleet, InProcessFleet | VirtualFleet)
            else {p.agent_id: read_records(fleet.stats_dir, p.agent_id) for p in fleet.processes}
        )
    results: dict[str, Any] = {"config": resolved}
    results.update(summarise(records, reference=reference_answer(config)))
    results["total_wall_s"] = round(time.monotonic() - started, 3)
    results["interrupted"] = interrupted
    results["versions"] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if config.wireless is not None:
        if isinstance(fleet, VirtualFleet):
            end, run = fleet.end_time_s, fleet.wireless
        else:
            end, run = time.time() - (config.wireless.epoch_unix or 0.0), None
        finish_results(results, records, config, out_dir, end_time_s=end, run=run)
    write_results(out_dir / "results.json", results)
    if results["rounds"]:
        title = (
            f"{config.task.name} · {config.agents} agents · {config.topology} · "
            f"{config.algorithm} · loss {config.network.loss:g}"
        )
        if config.wireless is not None:
            title = (
                f"{config.task.name} · {config.agents} agents · {config.algorithm} · "
                f"wireless {config.wireless.name}"
            )
        plot_results(out_dir / "results.png", results, title)
    if interrupted:
        raise KeyboardInterrupt
    return results
