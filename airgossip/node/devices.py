"""A run of agents started by hand (on devices), held by a coordinator: what
``airgossip coordinator`` runs.

:class:`DeviceRun` takes the run's settings (:class:`DeviceRunSettings`), resolves its
config and builds its network once (the topology the coordinator hands out, the first graph
checked against the algorithm), serves the coordinator (:meth:`~DeviceRun.start`), follows
the run until every agent has finished or it is told to stop (:meth:`~DeviceRun.follow`),
writes ``results.json`` and the plot from the round records the agents reported
(:meth:`~DeviceRun.collect`) and, when asked, keeps serving the finished run until it is
told to stop (:meth:`~DeviceRun.serve_until`). Whatever keeps it from starting is one
:class:`DeviceRunError` line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from airgossip.common.http import HttpSecurity
from airgossip.common.identity import agent_ids
from airgossip.common.security.private_files import private_folder
from airgossip.common.security.tls import COORDINATOR_IDENTITY, SecurityError, TlsCredentials
from airgossip.common.stacks import StopFlag
from airgossip.common.topology import TopologyError
from airgossip.coordinator.client import STATUS_POLL_S
from airgossip.coordinator.membership import FleetView, LivenessSettings
from airgossip.coordinator.policy import POLICIES, TopologySpec
from airgossip.coordinator.roster import Roster
from airgossip.coordinator.run import RunSpec
from airgossip.coordinator.service import CoordinatorServer
from airgossip.coordinator.store import FleetStore, StoreError
from airgossip.edge.algorithms import algorithm_class
from airgossip.node.folder import refuse_used_out_dir
from airgossip.node.network import LinkRuntime, Network
from airgossip.node.results_writer import ResultsConfig, links_label, write_results
from airgossip.scenario.config import ConfigError, RunConfig, Settings, load_config
from airgossip.scenario.results import ResolvedFigures, RunIdentity, RunResults


class DeviceRunError(RuntimeError):
    """A device run that cannot start: a bad setting, a busy port, an unreadable database
    or certificate (one line: what was wrong)."""


@dataclass(frozen=True)
class DeviceRunSettings:
    """What ``airgossip coordinator`` was asked for (its ``--help`` says what each means)."""

    listen: str = "0.0.0.0:7070"
    metrics_port: int = 9470
    db: Path | None = None
    token: str = ""
    #: A scenario topology, or the coordinator's own ``k-out`` (None: the scenario's).
    topology: str | None = None
    out_degree: int = 2
    agents: int | None = None
    rounds: int | None = None
    config: Path | None = None
    out: Path | None = None
    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 10.0
    certs: Path | None = None
    #: TLS and basic auth in front of the metrics port (None: plain HTTP).
    metrics_security: HttpSecurity | None = None
    #: The identities that may take part, as ``--roster`` takes them
    #: (:meth:`~airgossip.coordinator.roster.Roster.parse`; None: ``agent-0`` ..
    #: ``agent-(agents-1)``).
    roster: str | None = None


def _with_stored_epoch(config: RunConfig, db: Path | None) -> RunConfig:
    """``config`` with the wireless t = 0 of the run ``db`` holds, if it holds one."""
    if db is None or config.wireless is None or not db.exists():
        return config
    store = FleetStore(db)
    try:
        stored = store.stored_run()
    finally:
        store.close()
    wireless = stored[1].get("wireless") if stored else None
    epoch = wireless.get("epoch_unix") if isinstance(wireless, dict) else None
    if not isinstance(epoch, int | float):
        return config
    return config.model_copy(
        update={"wireless": config.wireless.model_copy(update={"epoch_unix": epoch})}
    )


class DeviceRun:
    """One run of agents started by hand (see the module docstring)."""

    def __init__(
        self, settings: DeviceRunSettings, network_for: Callable[[RunConfig], Network]
    ) -> None:
        self.settings = s = settings
        #: The network a run config describes (the emulation layer's, handed in by the CLI).
        self.network_for = network_for
        if s.topology is not None and s.topology not in POLICIES:
            raise DeviceRunError(
                f"unknown topology '{s.topology}'; choose one of: {', '.join(POLICIES)}"
            )
        if not 0 <= s.metrics_port <= 65535:
            raise DeviceRunError(f"--metrics-port must be within 0..65535, got {s.metrics_port}")
        if s.out_degree < 1:
            raise DeviceRunError(f"--out-degree must be at least 1, got {s.out_degree}")
        try:
            self.liveness = LivenessSettings(s.heartbeat_interval_s, s.heartbeat_timeout_s)
            self._prepare()
            self.roster = self._roster()
        except (ValueError, StoreError) as err:  # ValueError: ConfigError among them
            raise DeviceRunError(str(err)) from None
        self.server: CoordinatorServer | None = None
        self.started = time.monotonic()

    def _prepare(self) -> None:
        s = self.settings
        overrides: Settings = {}
        if s.agents is not None:
            overrides["agents"] = s.agents
        if s.rounds is not None:
            overrides["rounds"] = s.rounds
        if s.topology is not None and s.topology != "k-out":
            overrides["topology"] = s.topology
        config = load_config(s.config, overrides, real_links=True)
        # A wireless scenario's t = 0 is now, on every agent's wall clock (or, for a run
        # taken back from --db, when that run started).
        self.network = self.network_for(_with_stored_epoch(config, s.db))
        self.config = self.network.launch(time.time())
        if s.topology == "k-out":
            if self.config.switching is not None:
                raise ConfigError(
                    "k-out is the coordinator's own graph; a [switching] schedule names the "
                    "graphs it goes through: leave --topology out"
                )
            if not algorithm_class(self.config.algorithm).supports_directed:
                raise ConfigError(
                    f"algorithm '{self.config.algorithm}' needs an undirected graph; k-out is "
                    "directed"
                )
            self.spec = TopologySpec("k-out", seed=self.config.seed, out_degree=s.out_degree)
        else:
            self.spec = self.network.topology()
        self.graph = self.network.first_graph()  # it can be built and fits the algorithm
        # A [switching] schedule: the coordinator plays the runtime's after_round, from the
        # agents' round reports.
        self.runtime: LinkRuntime | None = None
        if self.network.round_driven:
            self.runtime = self.network.runtime(list(agent_ids(self.config.agents)))

    def _roster(self) -> Roster:
        """The run's roster: ``--roster``, or the ids a fleet of the run's size has."""
        text = self.settings.roster
        try:
            roster = Roster.indexed(self.config.agents) if text is None else Roster.parse(text)
            roster.check_fits(self.config.agents)
        except ValueError as err:
            raise ValueError(f"--roster: {err}") from None
        return roster

    @property
    def links(self) -> str:
        """What the links are, in words."""
        return links_label(self.config, self.network, self.spec.name)

    def start(self) -> str:
        """Serve the coordinator; return its address. The results folder must be new."""
        s = self.settings
        host = s.listen.rpartition(":")[0]
        try:
            security = TlsCredentials.load(s.certs, COORDINATOR_IDENTITY) if s.certs else None
            server = CoordinatorServer(
                expected=self.config.agents, topology=self.spec, listen=s.listen,
                token=s.token, security=security, db=s.db, liveness=self.liveness,
                metrics_listen=f"{host}:{s.metrics_port}", metrics_security=s.metrics_security,
                run=RunSpec(scenario=self.config.model_dump(mode="json"),
                            rounds=self.config.rounds),
                switcher=self.runtime.switcher if self.runtime is not None else None,
                roster=self.roster,
            )  # fmt: skip
        except (OSError, StoreError, TopologyError, SecurityError) as err:
            raise DeviceRunError(str(err)) from None
        self.out_dir = s.out or Path("runs") / server.run_id
        try:
            refuse_used_out_dir(self.out_dir)
        except ConfigError as err:
            server.stop(grace_s=0)
            raise DeviceRunError(str(err)) from None
        self.server = server
        address = server.start()
        self.started = time.monotonic()
        return address

    def _server(self) -> CoordinatorServer:
        if self.server is None:
            raise RuntimeError("the run's coordinator is not started (DeviceRun.start)")
        return self.server

    def follow(
        self,
        stopped: StopFlag | threading.Event,
        on_progress: Callable[[FleetView], None],
        every_s: float,
    ) -> bool:
        """Wait until every agent has finished (True) or ``stopped`` is set or Ctrl-C
        (False); hand the fleet's view to ``on_progress`` every ``every_s`` seconds."""
        server = self._server()
        try:
            next_line = time.monotonic() + every_s
            while not server.status().complete:
                if stopped.wait(0.5):
                    return False
                if time.monotonic() >= next_line:
                    next_line = time.monotonic() + every_s
                    on_progress(server.view())
        except KeyboardInterrupt:
            return False
        return True

    def collect(self, *, interrupted: bool, keep_serving: bool = False) -> RunResults | None:
        """Write the run's results from the round records the agents reported and stop the
        coordinator (with ``keep_serving``, leave it serving: :meth:`serve_until`); None
        (nothing written) when no agent reported a round."""
        server = self._server()
        complete_at = time.monotonic()
        stop_now = not keep_serving
        try:
            return self._collect(server, interrupted)
        except BaseException:
            stop_now = True  # nothing to serve the final state of
            raise
        finally:
            if stop_now:
                if not interrupted:
                    # Agents that finished first ask every STATUS_POLL_S whether the run is
                    # complete: answer them (twice over) before going, or they leave
                    # believing the coordinator gone.
                    time.sleep(max(0.0, complete_at + 2 * STATUS_POLL_S - time.monotonic()))
                server.stop()

    def serve_until(self, stopped: StopFlag | threading.Event) -> None:
        """After :meth:`collect` with ``keep_serving``: keep serving the finished run
        (``/metrics``, ``/sd``, ``/fleet``, the run's status to agents), idle, until
        ``stopped`` is set or Ctrl-C; then stop the coordinator."""
        server = self._server()
        try:
            while not stopped.wait(3600.0):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()

    def _collect(self, server: CoordinatorServer, interrupted: bool) -> RunResults | None:
        records = server.round_records()
        if not records:
            return None
        view = server.view()
        resolved = self.network.resolved(self.graph, self.runtime)
        if self.spec.name != self.config.topology and self.config.wireless is None:
            # The coordinator's own topology (k-out, which no schedule switches): its graph's
            # figures, not the scenario's.
            phases = [len(phase) for phase in view.edges] or [0]
            resolved = ResolvedFigures(
                topology=self.spec.name, lambda2=view.lambda2, topology_period=len(phases),
                edges_per_round=sum(phases) / len(phases),
            )  # fmt: skip
        private_folder(self.out_dir)  # 0700 from the start, whatever the umask
        status, ended = view.run, time.time()
        wall_s = time.monotonic() - self.started
        if status is not None and status.started_unix is not None:
            wall_s = ended - status.started_unix  # the run's own time, from the full fleet on
        results = write_results(
            self.network, records, self.out_dir,
            # Agents started by hand, wherever they ran.
            config=ResultsConfig(self.config, resolved, mode="devices"),
            wall_s=wall_s, interrupted=interrupted, end_time_s=self.network.wall_clock()(),
            runtime=self.runtime, links=self.links,
        )  # fmt: skip
        last = [agent_records[-1].counters for agent_records in records.values() if agent_records]
        results.run = RunIdentity(
            id=server.run_id,
            started_unix=status.started_unix if status is not None else None,
            ended_unix=round(ended, 3),
            agents={m.agent_id: m.state for m in view.members},
            messages_emulated_drops=sum(c.messages_dropped for c in last),
            messages_failed=sum(c.messages_failed for c in last),
        )
        results.write(self.out_dir / "results.json")
        return results
