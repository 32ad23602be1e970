"""One Ray actor hosting several agents: the ``ray`` fleet's unit of placement.

A :class:`RayAgentHost` is one Ray worker that starts a fork server
(:class:`~airgossip.emulation.fleets.forkserver.ForkServer`: one process imports torch and the
agent's modules once) and forks from it one process per agent it hosts, each the process mode's
agent (``python -m airgossip.emulation.agent``) listening on the node's address. Many agents
thus cost one Ray worker, one import of torch and a copy-on-write fork each, instead of a Ray worker
importing torch per agent; and each agent is still an OS process of its own, so one that crashes
takes none of its process-mates with it.

What each agent needs (:class:`~airgossip.node.ray_agent.RayAgentSpec`: its own key,
nothing of any other member) is written into a private folder of the host on its node
(``$TMPDIR/airgossip-host-<n>-*``), removed on every way the host ends (:meth:`stop`, its
worker's exit, or a watcher shell where the worker is killed). Checkpoints are shipped to the
driver's store actor (or kept on shared storage) as the agents write them.

Two ways an agent starts again. Its host's worker dies (its node lost, the worker killed):
its agents die with it (the fork server, or the kernel's parent-death signal, stops them:
they leave the run, or vanish with a lost machine and are declared dead), Ray restarts the
host elsewhere (``max_restarts``), and the new host takes each agent's newest
checkpoint back and forks it again; each resumes as a new incarnation and rejoins at the
fleet's round. One agent's process killed by a signal (OOM killer, ``kill -9``): its host
forks that agent again from its own newest checkpoint, up to ``max_restarts`` times, its
mates untouched. An agent that exits with an error (a bad setting) is not started again.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from airgossip.common.security.private_files import private_folder, write_private
from airgossip.emulation.fleets.agent_server import AGENT_MODULE, agent_environment, agent_preload
from airgossip.emulation.fleets.forkserver import ForkedChild, ForkServer
from airgossip.node.command import AgentCommand
from airgossip.node.ray_agent import (
    HOME_PREFIX,
    SHIP_INTERVAL_S,
    CheckpointShipper,
    RayAgentSpec,
    RayAgentState,
    remove_when_gone,
)

log = logging.getLogger("airgossip.ray")


@dataclass(frozen=True)
class RayHostSpec:
    """What one host actor is told: its name, its agents, how often one may be forked again."""

    host_id: str
    agents: tuple[RayAgentSpec, ...]
    #: Forks of an agent again after its process was killed (-1: no limit).
    max_restarts: int = 3


@dataclass
class HostedAgent:
    """One agent of a host: its folder, command, process and story."""

    spec: RayAgentSpec
    folder: Path
    checkpoints: Path
    command: AgentCommand
    resumed_from: str | None
    restarted: bool
    process: ForkedChild | None = None
    #: One log per process of the agent's (the fork server truncates a child's log).
    logs: list[Path] = field(default_factory=list)
    #: What the host has to say about the agent (restarts), before its logs.
    notes: list[str] = field(default_factory=list)
    forks: int = 0
    shipper: CheckpointShipper | None = None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def failure(self) -> str | None:
        """The agent's one-line error (``error: ...`` in its log), if it ended on one."""
        code = self.exit_code()
        if code in (None, 0):
            return None
        if code is not None and code < 0:
            return f"its process was killed by {signal.Signals(-code).name}"
        text = self.logs[-1].read_text(errors="replace") if self.logs else ""
        errors = [line for line in text.splitlines() if line.startswith("error: ")]
        return errors[-1].removeprefix("error: ") if errors else None


class RayAgentHost:
    """Body of one host actor (see the module docstring).

    Parameters
    ----------
    spec:
        The host's agents and what they need.
    """

    def __init__(self, spec: RayHostSpec) -> None:
        import ray

        context = ray.get_runtime_context()
        self.spec = spec
        self.node_id = context.get_node_id()
        self.node_ip = ray.util.get_node_ip_address()
        self.restarted = bool(context.was_current_actor_reconstructed)
        self.home = private_folder(Path(tempfile.mkdtemp(prefix=f"{HOME_PREFIX}{spec.host_id}-")))
        # The folder holds the agents' keys: gone on every way the host ends.
        atexit.register(shutil.rmtree, self.home, True)
        remove_when_gone(os.getpid(), self.home)
        first = spec.agents[0]
        self.store: Any = None
        if first.checkpoint_root is None and first.checkpoint_store is not None:
            self.store = ray.get_actor(first.checkpoint_store)
        self.agents = {a.agent_id: self._prepare(a) for a in spec.agents}
        self.stopping = threading.Event()
        self.server: ForkServer | None = None
        self.error: str | None = None
        # One thread starts the fork server and keeps it: the kernel's parent-death signal
        # follows the thread that started a process, and this one lives as long as the host.
        self._tending = threading.Thread(target=self._tend, name="host", daemon=True)
        self._tending.start()

    def _prepare(self, spec: RayAgentSpec) -> HostedAgent:
        folder = private_folder(self.home / spec.agent_id)
        certs = None
        if spec.credentials is not None:
            certs = private_folder(folder / "certs")
            for name, data in spec.credentials.items():
                write_private(certs / Path(name).name, data)
        if spec.checkpoint_root is not None:
            checkpoints = private_folder(Path(spec.checkpoint_root) / spec.agent_id)
        else:
            checkpoints = private_folder(folder / "checkpoints")
        resumed = None
        shipper = None
        if self.store is not None:
            resumed = CheckpointShipper.take_back(self.store, spec.agent_id, checkpoints)
            shipper = CheckpointShipper(spec.agent_id, checkpoints, self.store)
        command = AgentCommand(
            agent_id=spec.agent_id, index=spec.index, listen=f"{self.node_ip}:0",
            coordinator=spec.coordinator, stats_dir=folder / "records", linger_s=3600.0,
            ready_timeout_s=spec.ready_timeout_s,
            threads=spec.threads, certs=certs, insecure=certs is None,
            checkpoint_dir=checkpoints, checkpoint_interval_s=spec.checkpoint_interval_s,
        )  # fmt: skip
        hosted = HostedAgent(spec, folder, checkpoints, command, resumed, self.restarted)
        hosted.shipper = shipper
        if self.restarted:
            hosted.notes.append(
                f"{spec.agent_id} restarted by Ray on node {self.node_id} ({self.node_ip}) "
                f"with its host {self.spec.host_id}; resuming from "
                f"{resumed or 'its own checkpoints'}"
            )
        return hosted

    def _tend(self) -> None:
        threads = self.spec.agents[0].threads
        try:
            self.server = ForkServer(
                agent_preload(wireless=True),
                env={**agent_environment(), "OMP_NUM_THREADS": str(threads)},
                log_path=self.home / "forkserver.log", cwd=self.home, label=self.spec.host_id,
            )  # fmt: skip
            for hosted in self.agents.values():
                if self.stopping.is_set():
                    return
                self._fork(hosted)
            while not self.stopping.wait(SHIP_INTERVAL_S):
                for hosted in self.agents.values():
                    if hosted.shipper is not None:
                        hosted.shipper.ship()
                    if self._fork_again(hosted):
                        self._fork(hosted)
        except Exception as err:  # the host must say what ended its agents, not hang
            self.error = f"{type(err).__name__}: {err}"
            log.exception("host %s failed", self.spec.host_id)

    def _fork(self, hosted: HostedAgent) -> None:
        assert self.server is not None
        name = hosted.spec.agent_id
        path = hosted.folder / (f"{name}.log" if not hosted.forks else f"{name}.{hosted.forks}.log")
        command = replace(hosted.command, parent_pid=self.server.pid)  # dies with the server
        hosted.logs.append(path)
        hosted.process = self.server.spawn(
            AGENT_MODULE, command.argv(), log_path=path, cwd=hosted.folder
        )
        hosted.forks += 1

    def _may_fork_again(self, hosted: HostedAgent) -> bool:
        """Whether ``hosted``'s process was killed (not ended) and may be forked again."""
        code = hosted.exit_code()
        limit = self.spec.max_restarts
        return code is not None and code < 0 and (limit < 0 or hosted.forks <= limit)

    def _fork_again(self, hosted: HostedAgent) -> bool:
        """:meth:`_may_fork_again`, said in the agent's notes."""
        if not self._may_fork_again(hosted):
            return False
        code = hosted.exit_code()
        assert code is not None
        limit = self.spec.max_restarts
        newest = hosted.shipper.files.paths() if hosted.shipper is not None else []
        hosted.restarted = True
        hosted.resumed_from = newest[-1].name if newest else None
        hosted.notes.append(
            f"{hosted.spec.agent_id}'s process was killed by {signal.Signals(-code).name}; "
            f"its host {self.spec.host_id} forks it again (restart {hosted.forks} of "
            f"{'unlimited' if limit < 0 else limit}) from "
            f"{hosted.resumed_from or 'its own checkpoints'}"
        )
        return True

    def states(self) -> list[RayAgentState]:
        """Where the host runs and how each of its agents is doing (an agent about to be
        forked again: running)."""
        out = []
        for hosted in self.agents.values():
            code, error = hosted.exit_code(), hosted.failure()
            if self._may_fork_again(hosted):
                code, error = None, None
            if self.error is not None:
                code, error = 1, self.error
            state = RayAgentState(
                agent_id=hosted.spec.agent_id, node_id=self.node_id, node_ip=self.node_ip,
                restarted=hosted.restarted, resumed_from=hosted.resumed_from,
                exit_code=code, error=error,
            )  # fmt: skip
            out.append(state)
        return out

    def logs(self) -> dict[str, str]:
        """Each agent's log on this host: the host's notes, then every process's log."""
        out = {}
        for agent_id, hosted in self.agents.items():
            parts = [line + "\n" for line in hosted.notes]
            for path in hosted.logs:
                try:
                    parts.append(path.read_text(errors="replace"))
                except OSError:
                    continue
            out[agent_id] = "".join(parts)
        return out

    def stop(self) -> None:
        """Stop every agent (they leave the run), the fork server, and remove the folder."""
        self.stopping.set()
        self._tending.join(30.0)
        server = self.server
        if server is not None:
            for hosted in self.agents.values():
                if hosted.process is not None:
                    hosted.process.terminate()
            server.close()  # SIGTERM, a grace period, SIGKILL for what is left
        shutil.rmtree(self.home, ignore_errors=True)
