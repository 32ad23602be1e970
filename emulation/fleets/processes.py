"""Agents as OS processes: start them, follow their records, stop them.

:class:`AgentProcesses` is the one way fleets run agent processes
(``python -m airgossip.emulation.agent``, :mod:`airgossip.node`): the process,
namespace and container fleets each hold one (their base,
:class:`~airgossip.emulation.fleets.agent_fleet.AgentProcessFleet`), differing only in how an agent
finds its peers, what wraps its command (``ip netns exec``, ``docker run``) and where the
agent sees the run's folder (:class:`AgentHost`). Each agent
writes its round records as JSON lines under ``agents/`` and its log under ``logs/``; the
group tails the records for progress and reads them back at the end.

Agents without a command prefix are forked by a
:class:`~airgossip.emulation.fleets.forkserver.ForkServer` (on Linux): one process imports torch and
the agent's modules once and forks every agent, instead of every agent paying those imports on its
own (three quarters of an agent's start-up); the command line starts that server ahead of the
run, so that its imports run beside the launcher's own checks
(:mod:`~airgossip.emulation.fleets.agent_server`). An agent whose command is wrapped
(``ip netns exec``) is started as a process of its own, as is every agent where ``fork`` is
not available.

Unless the run is ``insecure``, the group issues the run's throwaway credentials
(:meth:`~airgossip.node.folder.RunFolder.issue_credentials`: the authority's key never
written) and every agent speaks mutual TLS with its own. Each agent keeps its checkpoints
under ``checkpoints/<id>/``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from pydantic import JsonValue

from airgossip.common.identity import agent_ids
from airgossip.common.security.private_files import open_private, private_folder
from airgossip.common.security.tls import COORDINATOR_IDENTITY, TlsCredentials
from airgossip.edge.observability.stats import RoundRecord, read_records
from airgossip.emulation.fleets.agent_server import (
    AGENT_MODULE,
    LOG_NAME,
    agent_environment,
    can_fork,
    start_fork_server,
    take_warm_fork_server,
)
from airgossip.emulation.fleets.base import (
    AgentProgress,
    FleetError,
    FleetProgress,
    ProgressKeeper,
    fleet_progress,
)
from airgossip.emulation.fleets.forkserver import ForkServer
from airgossip.node.command import AgentCommand
from airgossip.node.folder import RunFolder
from airgossip.scenario.config import RunConfig

#: Seconds without any agent progress after which a process fleet is declared stuck.
STALL_TIMEOUT_S = 180.0


class JsonLinesTail:
    """Reads the complete lines appended to a JSON-lines file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, JsonValue]]:
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


class ProcessHandle(Protocol):
    """What the fleet needs of an agent's process: a ``subprocess.Popen`` or a child of the
    fork server."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, signum: int) -> None: ...

    def kill(self) -> None: ...


@dataclass
class AgentProcess:
    """One running agent process, its log and the latest record it wrote."""

    agent_id: str
    process: ProcessHandle
    log_path: Path
    tail: JsonLinesTail
    latest: AgentProgress | None = None
    finished: bool = field(default=False)

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the agent's log, joined on one line."""
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def failure(self) -> str:
        """Why the agent stopped: the one-line error it printed, else the end of its log."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        errors = [line.strip() for line in text if line.startswith("error: ")]
        return errors[-1].removeprefix("error: ") if errors else self.log_tail()


@dataclass(frozen=True)
class AgentHost:
    """Where agent commands run: how the agent module is started there and where the run's
    folder is seen.

    Attributes
    ----------
    command:
        What runs :data:`~airgossip.emulation.fleets.agent_server.AGENT_MODULE` (this Python by
        default).
    run_dir:
        The run's output folder as the agent sees it (None: the launcher's own path).
    parent_pid:
        Pass ``--parent-pid`` so the agent never outlives the launcher (only where both
        share a process namespace).
    certs_dir:
        Where the agent sees its own ``ca.pem``, ``<id>.pem`` and ``<id>.key`` (None: its
        folder of the run's ``certs/``).
    """

    command: tuple[str, ...] = (sys.executable, "-m", AGENT_MODULE)
    run_dir: Path | None = None
    parent_pid: bool = True
    certs_dir: Path | None = None


class AgentProcesses:
    """The agent processes of one fleet, under one output folder.

    Parameters
    ----------
    config:
        The run (for progress: fleet size and rounds).
    folder:
        The run's folder: the config every agent reads, records under ``agents/``, logs
        under ``logs/`` (:class:`~airgossip.node.folder.RunFolder`).
    progress:
        Where progress goes as records arrive.
    host:
        Where the agent commands run (this machine by default).
    insecure:
        Plaintext gRPC, no certificates.
    fork_server:
        Fork the agents started without a command prefix from a fork server, started now
        (default: on Linux, for agents on this machine); False: every agent a fresh
        interpreter.
    """

    def __init__(
        self,
        config: RunConfig,
        folder: RunFolder,
        progress: ProgressKeeper,
        host: AgentHost | None = None,
        *,
        insecure: bool = False,
        fork_server: bool | None = None,
    ) -> None:
        self.config = config
        self.folder = folder
        self.host = host or AgentHost()
        self.fork_server: ForkServer | None = None
        if fork_server is None:  # agents on this machine, where it can fork
            fork_server = host is None and can_fork()
        if fork_server:
            # Started first: its imports run while this process makes the certificates and
            # the fleet starts its coordinator.
            self.fork_server = self._start_fork_server()
        self.secure = not insecure
        if self.secure:
            folder.issue_credentials([*agent_ids(config.agents), COORDINATOR_IDENTITY])
        self.progress = progress
        self.agents: list[AgentProcess] = []
        self.stopping = threading.Event()

    @property
    def stats_dir(self) -> Path:
        """Where the agents write their round records."""
        return self.folder.records_dir

    @property
    def logs_dir(self) -> Path:
        """Where the agents' logs go."""
        return self.folder.logs_dir

    def coordinator_credentials(self) -> TlsCredentials | None:
        """The embedded coordinator's credentials (None for an insecure run)."""
        if not self.secure:
            return None
        return self.folder.load_credentials(COORDINATOR_IDENTITY)

    def command(self, index: int, agent_id: str, own: AgentCommand) -> AgentCommand:
        """Agent ``index``'s command: ``own`` (how it finds its peers, what else it needs of
        its own) with what every agent of the group gets (the run's config, records,
        credentials, checkpoints, the fleet's size as the agents on the host, which sets
        their torch threads, serving its neighbours until stopped)."""
        certs = None
        if self.secure:
            certs = self.host.certs_dir or self.seen(self.folder.credentials(agent_id))
        return replace(
            own, config=self.seen(self.folder.config_path), agent_id=agent_id, index=index,
            stats_dir=self.seen(self.stats_dir), linger_s=3600.0, certs=certs,
            host_agents=self.config.agents,
            insecure=not self.secure,
            checkpoint_dir=self.seen(self.folder.checkpoint_dir(agent_id)),
        )  # fmt: skip

    def spawn(
        self, index: int, agent_id: str, own: AgentCommand, *, prefix: Sequence[str] = ()
    ) -> AgentProcess:
        """Start agent ``index`` with :meth:`command` of ``own``; ``prefix`` wraps the
        command (``ip netns exec NS``)."""
        private_folder(self.stats_dir)
        private_folder(self.logs_dir)
        log_path = self.logs_dir / f"{agent_id}.log"
        server = None if prefix else self.fork_server
        command = self.command(index, agent_id, own)
        if self.host.parent_pid:
            # A forked agent's parent is the fork server (which dies with this process).
            parent = server.pid if server is not None else os.getpid()
            command = replace(command, parent_pid=parent)
        process: ProcessHandle
        if server is not None:
            process = server.spawn(AGENT_MODULE, command.argv(), log_path=log_path, cwd=Path.cwd())
        else:
            with open_private(log_path, "wb") as log:
                process = subprocess.Popen(
                    [*prefix, *self.host.command, *command.argv()],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=agent_environment(),
                    start_new_session=True,  # Ctrl-C reaches the launcher only; it stops agents
                    cwd=os.getcwd(),
                )
        agent = AgentProcess(
            agent_id, process, log_path, JsonLinesTail(self.stats_dir / f"{agent_id}.jsonl")
        )
        self.agents.append(agent)
        return agent

    def seen(self, path: Path) -> Path:
        """``path`` (inside the run's folder) as the agents see it."""
        if self.host.run_dir is None:
            return path
        return self.host.run_dir / path.relative_to(self.folder.path)

    def _start_fork_server(self) -> ForkServer:
        private_folder(self.folder.path)
        log_path = self.folder.path / LOG_NAME
        wireless = self.config.network_kind == "wireless"
        # started by the command line, ahead of the run
        warm = take_warm_fork_server(log_path, wireless=wireless)
        if warm is not None:
            return warm
        return start_fork_server(log_path, str(self.folder.path), wireless=wireless)

    def _poll(self) -> None:
        for agent in self.agents:
            for data in agent.tail.read():
                agent.latest = AgentProgress.of(RoundRecord.from_json(data))
                agent.finished = agent.finished or agent.latest.final

    def snapshot(self, registered: int) -> FleetProgress:
        latest = [a.latest for a in self.agents if a.latest is not None]
        return fleet_progress(self.config, latest, registered)

    def monitor(self, registered: Callable[[], int]) -> None:
        """Follow the agents until all finished or :meth:`stop` was called.

        ``registered`` counts the agents that joined so far. :class:`FleetError` when an
        agent exits before finishing, or nothing progresses for ``STALL_TIMEOUT_S``.
        """
        last_change = time.monotonic()
        last_state: tuple[int, ...] = ()
        while not self.stopping.is_set():
            self._poll()
            for agent in self.agents:
                code = agent.process.poll()
                if code is not None and not agent.finished:
                    raise FleetError(
                        f"{agent.agent_id} exited with code {code} before finishing: "
                        f"{agent.failure() or 'no output'} (log: {agent.log_path})"
                    )
            count = registered()
            self.progress.update(self.snapshot(count))
            if all(a.finished for a in self.agents):
                return
            state = (count, *(a.latest.round if a.latest else -1 for a in self.agents))
            if state != last_state:
                last_state, last_change = state, time.monotonic()
            elif time.monotonic() - last_change > STALL_TIMEOUT_S:
                raise FleetError(
                    f"no agent made progress for {STALL_TIMEOUT_S:.0f} s; see {self.logs_dir}"
                )
            self.stopping.wait(0.1)

    def stop(self) -> None:
        """Make :meth:`monitor` return (safe from any thread; the agents keep running
        until :meth:`terminate`)."""
        self.stopping.set()

    def terminate(self, grace_s: float = 5.0) -> None:
        """SIGTERM every agent, then SIGKILL those still alive after ``grace_s``."""
        for agent in self.agents:
            if agent.process.poll() is None:
                agent.process.send_signal(signal.SIGTERM)
        if self.fork_server is not None:
            self.fork_server.shutdown()  # it exits as soon as its last agent has
        deadline = time.monotonic() + grace_s
        for agent in self.agents:
            try:
                agent.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                agent.process.kill()
                agent.process.wait()
        if self.fork_server is not None:
            self.fork_server.close()

    def records(self) -> dict[str, list[RoundRecord]]:
        """Every agent's records as written so far."""
        return {a.agent_id: read_records(self.stats_dir, a.agent_id) for a in self.agents}
