"""``ray`` mode: agents forked by host actors across a Ray cluster, an embedded coordinator
beside the driver, real gRPC (mutual TLS) between the agents.

The agents are split into hosts (``[ray] agents_per_host``; by default one host per node), each a
:class:`~airgossip.emulation.fleets.ray_host.RayAgentHost` actor that imports torch once in a fork
server and forks one process per agent: the same agent as the process mode, listening on its node's
address, shaping its links in the agent. The fleet connects to the cluster of ``[ray] address``
(``auto``,
``ray://...``, ``host:port``) or, with none, starts a local Ray on loopback; it places the hosts
with a placement group of one bundle per host, holding its agents' resources (``spread``: spread
over the nodes; ``strict-spread``: each host on a node of its own; ``pack``: as few nodes as fit),
starts the coordinator on the driver's node address, issues the run's certificates and hands each
agent only its own key. Ray restarts a host whose node dies (``max_restarts``), and its agents
resume from their newest checkpoints (shared storage, or the checkpoint store actor) and rejoin at
the fleet's round; a host forks again an agent whose process was killed. An agent whose process
ended cleanly counts as done. Where the cluster has no room left for them (a full cluster that lost
a node: Ray keeps them pending, says nothing), the fleet goes on without them as a device fleet goes
on without a dead device: the coordinator declares them dead (or they left, stopped with their host)
and splices them out of the graph, the survivors finish, and the run ends with them marked
``left_out`` in ``ray.json`` (``results.json``: ``complete`` false); when room returns before the
end, Ray places them and they rejoin from their checkpoints. ``results.json`` is written however the
run ends (an error or a stall: ``interrupted`` true). Results come from the coordinator's round
reports; each agent's log is fetched into ``logs/`` at the end, Ray's own output goes to
``logs/ray.log``, and ``ray.json`` says where every agent ran (its node, its restarts).
"""

from __future__ import annotations

import importlib.util
import json
import time
from typing import Any

from airgossip.common.identity import agent_ids
from airgossip.common.security.private_files import private_folder, write_private
from airgossip.common.security.tls import CA_CERT, COORDINATOR_IDENTITY
from airgossip.coordinator.service import CoordinatorServer
from airgossip.coordinator.views import DEAD, LEFT
from airgossip.edge.observability.stats import RoundRecord
from airgossip.emulation.fleets.agent_fleet import start_embedded_coordinator
from airgossip.emulation.fleets.base import (
    AgentProgress,
    Fleet,
    FleetError,
    Launch,
    fleet_progress,
)
from airgossip.emulation.fleets.processes import STALL_TIMEOUT_S
from airgossip.emulation.fleets.ray_cluster import RayCluster
from airgossip.emulation.fleets.ray_host import RayHostSpec
from airgossip.emulation.networks import LinkRuntime, Network
from airgossip.node.folder import RunFolder
from airgossip.node.ray_agent import RayAgentSpec, RayAgentState
from airgossip.scenario.config import RunConfig
from airgossip.scenario.modes.ray import RaySettings

#: What to install for this mode, said in one line where Ray is missing.
INSTALL_HINT = "mode 'ray' needs Ray: pip install 'airgossip[ray]'"
#: How long an agent the coordinator declared dead must wait for room on the cluster before
#: the fleet counts it out (a restart that finds room takes a few seconds).
NO_ROOM_GRACE_S = 10.0
#: Longest wait of an agent for the fleet to fill (more for a fleet of over 60 agents).
READY_TIMEOUT_S = 120.0
#: How often Ray is asked which actors wait for a place (one GCS call).
PLACEMENT_POLL_S = 2.0


def ray_available() -> bool:
    """Whether Ray can be imported here."""
    return importlib.util.find_spec("ray") is not None


class RayFleet(Fleet):
    """Agents forked by host actors on a Ray cluster (see the module docstring)."""

    mode = "ray"
    emulates_devices = True
    serves_metrics = True
    settings_model = RaySettings

    def __init__(self, config: RunConfig, network: Network, launch: Launch) -> None:
        super().__init__(config, network, launch)
        self.launch: Launch = launch
        self.folder = RunFolder(launch.out_dir.resolve())
        self.settings = config.mode_settings(RaySettings)
        self.ids = agent_ids(config.agents)
        self.coordinator: CoordinatorServer | None = None
        self.cluster: RayCluster | None = None
        #: Host actors by host id, and the agents each one forks.
        self.hosts: dict[str, Any] = {}
        self.members: dict[str, tuple[str, ...]] = {}
        #: Every state each agent's host reported, in order (its nodes, its restarts).
        self.states: dict[str, list[RayAgentState]] = {i: [] for i in self.ids}
        self._records: dict[str, list[RoundRecord]] = {}
        self._links = network.runtime(self.ids) if network.round_driven else None
        #: Agents whose hosts Ray will not restart (gone for good).
        self.gone: set[str] = set()
        #: Agents whose process ended cleanly (exit code 0: it ran to the end).
        self.ended: set[str] = set()
        #: Agents the run ended without (no room for them on the cluster, or gone).
        self.left_out: list[str] = []
        #: Agents whose host's placement bundle no node holds (no room for it).
        self._no_node: set[str] = set()
        #: When each agent waiting for a place was first seen waiting.
        self._waiting_since: dict[str, float] = {}
        self._started = time.monotonic()

    @classmethod
    def refuse(cls, config: RunConfig, network: Network) -> str | None:
        return None if ray_available() else INSTALL_HINT

    def run(self) -> None:
        self._started = time.monotonic()
        self.cluster = RayCluster(
            self.settings, self.config.agents, self.launch.notice,
            ray_log=self.folder.logs_dir / "ray.log",
        )  # fmt: skip
        try:
            self.cluster.connect()
            self._start()
            self._monitor()
        except FleetError as err:
            self._close()
            if self.coordinator is not None:  # agents ran: what they did is kept
                self._write_partial()
                raise FleetError(f"{err}; partial results in {self.folder.path}") from None
            raise
        except BaseException:
            self._close()
            raise
        else:
            self._close()

    def _write_partial(self) -> None:
        """``results.json`` of a run an error ended: every round recorded, ``interrupted``."""
        from airgossip.node.results_writer import ResultsConfig, write_results

        resolved = ResultsConfig(
            self.config, self.network.resolved(self.network.first_graph(), self._links)
        )
        write_results(
            self.network, self._records, self.folder.path, config=resolved,
            wall_s=time.monotonic() - self._started, interrupted=True,
            end_time_s=self.clock_s(), runtime=self._links,
        )  # fmt: skip

    def _start(self) -> None:
        assert self.cluster is not None
        secure = not self.launch.insecure
        if secure:
            self.folder.issue_credentials([*self.ids, COORDINATOR_IDENTITY])
        port = self.launch.coordinator_listen.rpartition(":")[2]
        self.coordinator, address = start_embedded_coordinator(
            self,
            f"{self.cluster.driver_ip}:{port}",
            self.folder.load_credentials(COORDINATOR_IDENTITY) if secure else None,
            self._links,
            "; /sd lists the agents' metrics",
        )
        sizes = self.cluster.host_sizes()
        self.cluster.place(sizes)
        shared = self.settings.checkpoints
        root = str(shared.resolve() / self.folder.path.name) if shared is not None else None
        specs = [self._spec(index, address, root) for index in range(len(self.ids))]
        first = 0
        for index, size in enumerate(sizes):
            host = RayHostSpec(
                f"host-{index}", tuple(specs[first : first + size]), self.settings.max_restarts
            )
            first += size
            self.members[host.host_id] = tuple(a.agent_id for a in host.agents)
            self.hosts[host.host_id] = self.cluster.start_host(index, host)
        self.launch.notice(
            f"{len(self.ids)} agents in {len(sizes)} host actors of up to {max(sizes)} "
            f"({self.cluster.bundle(max(sizes))} each)"
        )

    def _spec(self, index: int, coordinator: str, root: str | None) -> RayAgentSpec:
        """What agent ``index`` is told (its own key only)."""
        assert self.cluster is not None
        agent_id = self.ids[index]
        return RayAgentSpec(
            agent_id=agent_id, index=index, coordinator=coordinator,
            credentials=None if self.launch.insecure else self._credentials(agent_id),
            checkpoint_root=root, checkpoint_store=self.cluster.store_name,
            checkpoint_interval_s=self.settings.checkpoint_interval_s,
            threads=max(1, round(self.settings.num_cpus)),
            # A large fleet on few cores fills slowly (each agent registers with one
            # coordinator; 256 on 2 loaded cores: 3.5 min): two seconds an agent, two
            # minutes at least (the fleet's stall check still ends a fleet that stopped).
            ready_timeout_s=max(READY_TIMEOUT_S, 2.0 * len(self.ids)),
        )  # fmt: skip

    def _credentials(self, agent_id: str) -> dict[str, bytes]:
        """The CA's certificate and ``agent_id``'s own certificate and key, nothing else."""
        folder = self.folder.credentials(agent_id)
        names = (CA_CERT, f"{agent_id}.pem", f"{agent_id}.key")
        return {name: (folder / name).read_bytes() for name in names}

    def _monitor(self) -> None:
        """Follow the run until every agent still in it finished; :class:`FleetError` when
        an agent stopped on an error or nothing progresses (saying which agents wait for
        room on the cluster, if any)."""
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        assert self.coordinator is not None and self.cluster is not None
        last_change = time.monotonic()
        last_state: tuple[int, ...] = ()
        asked: dict[Any, str] = {}
        waiting: set[str] = set()
        unplaced: set[str] = set()
        polled = 0.0
        while not self.stopping.is_set():
            # The latest record of each agent only: every record (estimates included) is
            # read once, at the end (:meth:`_close`).
            latest = {i: AgentProgress.of(r) for i, r in self.coordinator.latest_records().items()}
            registered = self.coordinator.registered()
            self.keeper.update(fleet_progress(self.config, latest.values(), registered))
            now = time.monotonic()
            if now - polled >= PLACEMENT_POLL_S:
                polled, unplaced = now, self.cluster.unplaced(self.hosts)
                waiting = self._agents_of(unplaced)
                homeless = self.cluster.bundles_without_node()
                self._no_node = self._agents_of({f"host-{i}" for i in homeless} & unplaced)
                self._waiting_since = {
                    i: self._waiting_since.get(i, now) for i in waiting
                }  # fmt: skip
            out = self.gone | self._no_room(now)
            running = [i for i in self.ids if i not in out]
            # Done: its final round reported, or its process ended cleanly (it ran to the end;
            # a final report a starved coordinator missed does not hold the fleet).
            if running and all(
                i in self.ended or (i in latest and latest[i].final) for i in running
            ):
                self._end_without(sorted(out, key=self.ids.index))
                return
            if not asked:
                asked = {
                    host.states.remote(): h for h, host in self.hosts.items()
                    if h not in unplaced and not set(self.members[h]) <= self.gone
                }  # fmt: skip
            ready, _ = ray.wait(list(asked), num_returns=len(asked), timeout=0.5)
            for ref in ready:
                host_id = asked.pop(ref)
                try:
                    for state in ray.get(ref, timeout=5):
                        self._heard(state)
                except (ActorUnavailableError, GetTimeoutError):
                    continue  # restarting on another node: asked again next time
                except RayActorError as err:
                    self.gone.update(self.members[host_id])
                    self.launch.notice(
                        f"{host_id}'s actor is gone and Ray will not restart it (max_restarts "
                        f"{self.settings.max_restarts}); the fleet goes on without its agents "
                        f"{', '.join(self.members[host_id])}: "
                        f"{str(err).strip().splitlines()[0] if str(err).strip() else err!r}"
                    )
            if not running and not waiting:
                raise FleetError("every host actor is gone and Ray will not restart them")
            state = (registered, *(p.round for p in latest.values()))
            if state != last_state:
                last_state, last_change = state, time.monotonic()
            elif time.monotonic() - last_change > STALL_TIMEOUT_S:
                raise FleetError(self._stall(waiting))
            self.stopping.wait(0.2)

    def _agents_of(self, hosts: set[str]) -> set[str]:
        """The agents the hosts ``hosts`` fork."""
        return {agent_id for h in hosts for agent_id in self.members[h]}

    def _no_room(self, now: float) -> set[str]:
        """The agents counted out for want of room: gone from the run (declared dead by the
        coordinator, or left when their host died and stopped them), their host's bundle on
        no node (a host restarting where there is room is only slow) and waiting for a place
        for longer than :data:`NO_ROOM_GRACE_S`."""
        assert self.coordinator is not None
        members = self.coordinator.view().members
        dead = {m.agent_id for m in members if m.state in (DEAD, LEFT)}
        return {
            i for i, since in self._waiting_since.items()
            if i in dead and i in self._no_node and now - since >= NO_ROOM_GRACE_S
        }  # fmt: skip

    def _end_without(self, out: list[str]) -> None:
        """Say which agents the run ended without (none: nothing said)."""
        self.left_out = out
        if not out:
            return
        unplaced = [i for i in out if i not in self.gone]
        why = (
            f"no room on the cluster for {len(unplaced)} (Ray keeps them pending)"
            if unplaced
            else "their hosts are gone"
        )
        self.launch.notice(
            f"the survivors finished; the run ends without {', '.join(out)}: {why}; "
            "results.json counts their last rounds (complete: false)"
        )

    def _stall(self, waiting: set[str]) -> str:
        """Why nothing progresses: no room for some agents, or no progress at all."""
        if waiting:
            names = ", ".join(sorted(waiting, key=self.ids.index))
            return (
                f"no room on the cluster for {len(waiting)} agents ({names}: Ray keeps their "
                f"hosts pending placement) and no other agent made progress for "
                f"{STALL_TIMEOUT_S:.0f} s; add nodes or lower [ray] num_cpus"
            )
        return f"no agent made progress for {STALL_TIMEOUT_S:.0f} s"

    def _heard(self, state: RayAgentState) -> None:
        if state.exit_code == 0:
            self.ended.add(state.agent_id)
        seen = self.states[state.agent_id]
        if not seen or seen[-1].node_id != state.node_id or seen[-1].restarted != state.restarted:
            if state.restarted:
                self.launch.notice(
                    f"{state.agent_id} started again on node {state.node_id[:12]} "
                    f"({state.node_ip}), from checkpoint {state.resumed_from or '(its own)'}"
                )
            seen.append(state)
        if state.exit_code not in (None, 0) or state.error:
            raise FleetError(
                f"{state.agent_id} stopped with code {state.exit_code}: "
                f"{state.error or 'see its log'}"
            )

    def _close(self) -> None:
        cluster, coordinator = self.cluster, self.coordinator
        try:
            if cluster is not None and cluster.connected:
                self._gather(cluster)
        finally:
            if coordinator is not None:
                self._records = coordinator.round_records()
                coordinator.stop(grace_s=0.5)
            if cluster is not None:
                cluster.close()

    def _gather(self, cluster: RayCluster) -> None:
        """Fetch each agent's log into ``logs/``, stop the hosts, write ``ray.json``."""
        logs = self.folder.logs_dir
        private_folder(logs)
        # Hosts that wait for a place (or are gone) would only hold every call to its end.
        hosts = cluster.unplaced(self.hosts)
        unplaced = self._agents_of(hosts)
        placed = {
            h: a for h, a in self.hosts.items()
            if h not in hosts and not set(self.members[h]) <= self.gone
        }  # fmt: skip
        for texts in cluster.call_all(placed, "logs").values():
            if isinstance(texts, dict):
                for agent_id, text in texts.items():
                    write_private(logs / f"{agent_id}.log", text)
        for states in cluster.call_all(placed, "states").values():
            for state in states if isinstance(states, list) else []:
                if isinstance(state, RayAgentState):
                    self._heard_quietly(state)
        cluster.call_all(placed, "stop")
        placements = {
            agent_id: [
                {"node_id": s.node_id, "node_ip": s.node_ip, "restarted": s.restarted,
                 "resumed_from": s.resumed_from}
                for s in states
            ]
            for agent_id, states in self.states.items()
        }  # fmt: skip
        report = {
            "address": cluster.address, "placement": self.settings.placement,
            "hosts": {h: list(agents) for h, agents in self.members.items()},
            "nodes": cluster.nodes(), "agents": placements, "left_out": self.left_out,
            "unplaced_at_end": sorted(unplaced, key=self.ids.index),
        }  # fmt: skip
        write_private(self.folder.path / "ray.json", json.dumps(report, indent=2) + "\n")

    def _heard_quietly(self, state: RayAgentState) -> None:
        seen = self.states[state.agent_id]
        if not seen or seen[-1].node_id != state.node_id:
            seen.append(state)

    def records(self) -> dict[str, list[RoundRecord]]:
        return self._records

    @property
    def runtime(self) -> LinkRuntime | None:
        return self._links
