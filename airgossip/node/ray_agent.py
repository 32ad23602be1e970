"""What the ``ray`` fleet's actors are told and say, and where their agents' checkpoints go.

The ``ray`` fleet (:mod:`airgossip.emulation.fleets.ray_fleet`) runs its agents in host actors
(:mod:`airgossip.emulation.fleets.ray_host`), each forking several agent processes. Each agent gets
a
:class:`RayAgentSpec` (through Ray's object store, never a shared file system): its id, the
coordinator to dial and, for mutual TLS, the run authority's certificate with the agent's
own certificate and key, nothing of any other member. Its host writes them into a private
folder on its node and forks the agent (``python -m airgossip.emulation.agent``, the process
mode's agent), listening on its node's address; its links are shaped in the agent.

Checkpoints go where a restarted host can read them: a folder on shared storage the user
names, or (by default) a :class:`CheckpointKeeper` actor the driver keeps beside it, to which
a :class:`CheckpointShipper` ships each agent's newest checkpoint as the agent writes it.
When Ray restarts a host (its node died; ``max_restarts``) the host's constructor runs again
on another node: it takes its agents' newest checkpoints back, and each agent resumes from
its own as a new incarnation and rejoins at the fleet's round (:mod:`airgossip.edge.agent.rejoin`).
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airgossip.common.security.private_files import write_private
from airgossip.edge.agent.checkpoints import CheckpointStore

#: How often the agent's checkpoint folder is looked at for a new checkpoint to ship.
SHIP_INTERVAL_S = 1.0
#: Prefix of a host actor's private folder (its agents' keys, certificates, logs, checkpoints).
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
    """What one agent is told (pickled into its host actor's constructor's arguments).

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
        The name of the :class:`CheckpointKeeper` actor (used without ``checkpoint_root``).
    checkpoint_interval_s:
        Seconds between the agent's checkpoints.
    threads:
        Torch CPU threads (the CPUs Ray reserved for the agent).
    ready_timeout_s:
        Longest wait for the fleet to fill (every agent registered and placed).
    """

    agent_id: str
    index: int
    coordinator: str
    credentials: dict[str, bytes] | None
    checkpoint_root: str | None = None
    checkpoint_store: str | None = None
    checkpoint_interval_s: float = 5.0
    threads: int = 1
    ready_timeout_s: float = 120.0


@dataclass(frozen=True)
class RayAgentState:
    """What a host says about one of its agents: where it runs and how it is doing."""

    agent_id: str
    node_id: str
    node_ip: str
    #: Started again: Ray restarted its host (the node or the host's worker died), or the
    #: host forked it again (its process was killed).
    restarted: bool
    #: The checkpoint it took back from the store when it started (None: none).
    resumed_from: str | None
    #: The agent's exit code once it stopped (None: still running).
    exit_code: int | None
    #: Its one-line error, if it stopped on one.
    error: str | None


class CheckpointKeeper:
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


class CheckpointShipper:
    """Sends each new checkpoint an agent writes into ``folder`` to the store actor ``store``
    (one in flight per agent at most); call :meth:`ship` now and then."""

    def __init__(self, agent_id: str, folder: Path, store: Any) -> None:
        self.agent_id = agent_id
        self.files = CheckpointStore(folder, agent_id)  # the agent's own, as named
        self.store = store
        self.shipped: str | None = None
        self.pending: Any = None

    def ship(self) -> None:
        """Ship the newest checkpoint if it is new and the last one has arrived."""
        import ray

        paths = self.files.paths()
        if not paths or paths[-1].name == self.shipped:
            return
        if self.pending is not None:
            ready, _ = ray.wait([self.pending], timeout=0)
            if not ready:
                return
        try:
            data = paths[-1].read_bytes()
        except OSError:  # pruned by the agent meanwhile: the next one will do
            return
        self.pending = self.store.put.remote(self.agent_id, paths[-1].name, data)
        self.shipped = paths[-1].name

    @staticmethod
    def take_back(store: Any, agent_id: str, folder: Path) -> str | None:
        """Put ``store``'s newest checkpoint of ``agent_id`` into ``folder``; its name."""
        import ray

        held = ray.get(store.latest.remote(agent_id))
        if held is None:
            return None
        name, data = held
        write_private(folder / Path(name).name, data)
        return str(name)
