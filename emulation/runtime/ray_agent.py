"""One agent as a Ray actor: the same agent as a process fleet's, run inside a Ray worker.

:class:`RayAgent` is the body of the actor the ``ray`` fleet
(:mod:`emulation.fleets.ray_fleet`) starts once per agent. Its constructor gets a
:class:`RayAgentSpec` (through Ray's object store, never a shared file system): the agent's
id, the coordinator to dial and, for mutual TLS, the run authority's certificate with the
agent's own certificate and key, nothing of any other member. It writes them into a private
folder of its own on its node and runs :func:`~emulation.runtime.process.run_agent_command`
(what ``python -m emulation.runtime.agent`` runs) in a thread, listening on its node's
address; its links are shaped in the agent, as in the process mode.

Checkpoints go where a restarted actor can read them: a folder on shared storage the user
names, or (by default) a :class:`CheckpointStore` actor the driver keeps beside it, to which
the agent ships its newest checkpoint as it writes it. When Ray restarts the actor (its node
died; ``max_restarts``) the constructor runs again on another node: it takes the newest
checkpoint back, and the agent resumes from it as a new incarnation and rejoins at the
fleet's round (:mod:`edge.agent.rejoin`).
"""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.agent.checkpoints import CheckpointStore as AgentCheckpoints
from edge.security.private_files import private_folder, write_private
from emulation.runtime.command import AgentCommand

#: How often the agent's checkpoint folder is looked at for a new checkpoint to ship.
SHIP_INTERVAL_S = 1.0
#: Prefix of an agent actor's private folder (its key, certificates, log, checkpoints).
HOME_PREFIX = "airgossip-"


def remove_when_gone(pid: int, folder: Path) -> None:
    """Remove ``folder`` once process ``pid`` is gone, however it ends.

    A Ray worker can end with no chance to clean up: its driver killed (Ray kills the job's
    actors at once), its node's raylet gone, ``ray.kill``. A shell orphaned at once (the
    process Ray would kill with its worker has already exited) waits for the worker and
    removes the folder after it.
    """
    watch = (
        f"(while kill -0 {pid} 2>/dev/null; do sleep 1; done; "
        f"rm -rf {shlex.quote(str(folder))}) >/dev/null 2>&1 </dev/null &"
    )
    subprocess.run(["sh", "-c", watch], check=False, start_new_session=True, timeout=10)


@dataclass(frozen=True)
class RayAgentSpec:
    """What one agent actor is told (pickled into its constructor's arguments).

    Attributes
    ----------
    agent_id, index:
        Who the agent is in the fleet.
    coordinator:
        ``host:port`` of the run's coordinator (beside the driver).
    credentials:
        File name to contents: ``ca.pem``, ``<id>.pem``, ``<id>.key`` (None: plaintext).
    checkpoint_root:
        A folder on storage every node shares, where the agent keeps its checkpoints under
        its id (None: a private folder on its node, shipped to the checkpoint store).
    checkpoint_store:
        The name of the :class:`CheckpointStore` actor (used without ``checkpoint_root``).
    checkpoint_interval_s:
        Seconds between the agent's checkpoints.
    threads:
        Torch CPU threads (the CPUs Ray reserved for the actor).
    """

    agent_id: str
    index: int
    coordinator: str
    credentials: dict[str, bytes] | None
    checkpoint_root: str | None = None
    checkpoint_store: str | None = None
    checkpoint_interval_s: float = 5.0
    threads: int = 1


@dataclass(frozen=True)
class RayAgentState:
    """What an agent actor says about itself: where it runs and how its agent is doing."""

    agent_id: str
    node_id: str
    node_ip: str
    #: Ray restarted this actor (its first incarnation's node or process died).
    restarted: bool
    #: The checkpoint it took back from the store when it started (None: none).
    resumed_from: str | None
    #: The agent's exit code once it stopped (None: still running).
    exit_code: int | None
    #: Its one-line error, if it stopped on one.
    error: str | None


class CheckpointStore:
    """Body of the actor that keeps each agent's newest checkpoint (bytes) for the agent's
    next incarnation, wherever Ray restarts it."""

    def __init__(self) -> None:
        self._latest: dict[str, tuple[str, bytes]] = {}

    def put(self, agent_id: str, name: str, data: bytes) -> None:
        """Keep ``data`` (checkpoint file ``name``) as ``agent_id``'s newest."""
        self._latest[agent_id] = (name, data)

    def latest(self, agent_id: str) -> tuple[str, bytes] | None:
        """``agent_id``'s newest checkpoint (file name, bytes), or None."""
        return self._latest.get(agent_id)

    def held(self) -> dict[str, str]:
        """The file name of every agent's checkpoint held."""
        return {agent_id: name for agent_id, (name, _) in self._latest.items()}


class RayAgent:
    """Body of one agent's actor (see the module docstring).

    Parameters
    ----------
    spec:
        The agent and what it needs.
    """

    def __init__(self, spec: RayAgentSpec) -> None:
        import ray

        context = ray.get_runtime_context()
        self.spec = spec
        self.node_id = context.get_node_id()
        self.node_ip = ray.util.get_node_ip_address()
        self.restarted = bool(context.was_current_actor_reconstructed)
        self.home = private_folder(Path(tempfile.mkdtemp(prefix=f"{HOME_PREFIX}{spec.agent_id}-")))
        # The folder holds the agent's key: gone on every way the actor ends (stop(), a
        # normal exit of the worker, or the worker killed: the watcher).
        atexit.register(shutil.rmtree, self.home, True)
        remove_when_gone(os.getpid(), self.home)
        self.log_path = self.home / f"{spec.agent_id}.log"
        self._log = logging.FileHandler(self.log_path)
        self._log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(self._log)
        logging.getLogger().setLevel(logging.INFO)
        certs = self._write_credentials(spec.credentials)
        if spec.checkpoint_root is not None:
            checkpoints = private_folder(Path(spec.checkpoint_root) / spec.agent_id)
        else:
            checkpoints = private_folder(self.home / "checkpoints")
        self.store: Any = None
        if spec.checkpoint_root is None and spec.checkpoint_store is not None:
            self.store = ray.get_actor(spec.checkpoint_store)
        self.resumed_from = self._take_back(checkpoints)
        self.command = AgentCommand(
            agent_id=spec.agent_id, index=spec.index, listen=f"{self.node_ip}:0",
            coordinator=spec.coordinator, stats_dir=self.home / "agents", linger_s=3600.0,
            threads=spec.threads, certs=certs, insecure=certs is None, checkpoint_dir=checkpoints,
            checkpoint_interval_s=spec.checkpoint_interval_s,
        )  # fmt: skip
        self.stopping = threading.Event()
        self.exit_code: int | None = None
        self.error: str | None = None
        self._agent = threading.Thread(target=self._run, name="agent", daemon=True)
        self._agent.start()
        if self.store is not None:
            threading.Thread(
                target=self._ship, args=(checkpoints,), name="ship-checkpoints", daemon=True
            ).start()

    def _write_credentials(self, credentials: dict[str, bytes] | None) -> Path | None:
        if credentials is None:
            return None
        folder = private_folder(self.home / "certs")
        for name, data in credentials.items():
            write_private(folder / Path(name).name, data)
        return folder

    def _take_back(self, checkpoints: Path) -> str | None:
        """Put the store's newest checkpoint of this agent into ``checkpoints``."""
        if self.store is None:
            return None
        import ray

        held = ray.get(self.store.latest.remote(self.spec.agent_id))
        if held is None:
            return None
        name, data = held
        write_private(checkpoints / Path(name).name, data)
        return str(name)

    def _run(self) -> None:
        from emulation.runtime.process import AgentProcessError, run_agent_command

        log = logging.getLogger("airgossip.agent")
        if self.restarted:
            log.info(
                "%s restarted by Ray on node %s (%s); resuming from %s", self.spec.agent_id,
                self.node_id, self.node_ip, self.resumed_from or "its own checkpoints",
            )  # fmt: skip
        try:
            self.exit_code = run_agent_command(self.command, self.stopping)
        except AgentProcessError as err:
            self.error, self.exit_code = str(err), 2
            log.error("%s", err)
        except Exception as err:  # the actor must say what ended its agent, not hang
            self.error, self.exit_code = f"{type(err).__name__}: {err}", 1
            log.exception("%s crashed", self.spec.agent_id)

    def _ship(self, checkpoints: Path) -> None:
        """Send each new checkpoint the agent writes to the store (one in flight at most)."""
        import ray

        files = AgentCheckpoints(checkpoints, self.spec.agent_id)  # the agent's own, as named
        shipped = None
        pending = None
        while not self.stopping.wait(SHIP_INTERVAL_S):
            paths = files.paths()
            if not paths or paths[-1].name == shipped:
                continue
            if pending is not None:
                ready, _ = ray.wait([pending], timeout=0)
                if not ready:
                    continue
            try:
                data = paths[-1].read_bytes()
            except OSError:  # pruned by the agent meanwhile: the next one will do
                continue
            pending = self.store.put.remote(self.spec.agent_id, paths[-1].name, data)
            shipped = paths[-1].name

    def state(self) -> RayAgentState:
        """Where the actor runs and how its agent is doing."""
        return RayAgentState(
            agent_id=self.spec.agent_id, node_id=self.node_id, node_ip=self.node_ip,
            restarted=self.restarted, resumed_from=self.resumed_from,
            exit_code=self.exit_code, error=self.error,
        )  # fmt: skip

    def log(self) -> str:
        """This incarnation's log."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the agent (it leaves the run), wait for it, and remove the private folder."""
        self.stopping.set()
        self._agent.join(timeout_s)
        logging.getLogger().removeHandler(self._log)
        self._log.close()
        shutil.rmtree(self.home, ignore_errors=True)
