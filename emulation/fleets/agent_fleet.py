"""The base of fleets whose agents are OS processes (``process``, ``namespaces``,
``containers``): what they share, written once.

An :class:`AgentProcessFleet` holds the run's :class:`~airgossip.node.folder.RunFolder`
and an :class:`~airgossip.emulation.fleets.processes.AgentProcesses` group; its records, progress
and stopping come from the group. :meth:`~AgentProcessFleet.run` starts the agents
(:meth:`~AgentProcessFleet.start_agents`, the one thing every mode writes), follows them to the end,
then stops them and closes what the mode started (:meth:`~AgentProcessFleet.close`), whatever
happened. A mode whose agents find each other through a coordinator starts the embedded one
(:meth:`~AgentProcessFleet.start_coordinator`), which also switches a graph that changes by round
(``[switching]``): it sees every agent's round reports.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

from airgossip.common.identity import agent_ids
from airgossip.common.security.tls import TlsCredentials
from airgossip.coordinator.roster import Roster
from airgossip.coordinator.run import RunSpec
from airgossip.coordinator.service import CoordinatorServer
from airgossip.edge.observability.stats import RoundRecord
from airgossip.emulation.fleets.base import Fleet, Launch
from airgossip.emulation.fleets.processes import AgentHost, AgentProcesses
from airgossip.emulation.networks import LinkRuntime, Network
from airgossip.node.folder import RunFolder
from airgossip.scenario.config import RunConfig


def start_embedded_coordinator(
    fleet: Fleet,
    listen: str,
    security: TlsCredentials | None,
    links: LinkRuntime | None,
    metrics_note: str = "",
) -> tuple[CoordinatorServer, str]:
    """Start the coordinator a fleet embeds on ``listen`` (its metrics where the launch asks,
    said to the launcher with ``metrics_note``; ``links`` switched by round when the network
    changes by round); the server and the address agents dial."""
    assert fleet.launch is not None
    coordinator = CoordinatorServer(
        expected=fleet.config.agents,
        topology=fleet.network.topology(),
        listen=listen,
        metrics_listen=fleet.launch.coordinator_metrics_listen,
        security=security,
        run=RunSpec(scenario=fleet.config.model_dump(mode="json"), rounds=fleet.config.rounds),
        switcher=links.switcher if links is not None else None,
        roster=Roster.indexed(fleet.config.agents),  # the ids the fleet gives its agents
    )
    address = coordinator.start()
    if coordinator.metrics_address:
        fleet.launch.notice(
            f"fleet metrics at http://{coordinator.metrics_address}/metrics "
            f"(service discovery /sd, fleet /fleet{metrics_note})"
        )
    return coordinator, address


class AgentProcessFleet(Fleet):
    """A fleet of agent processes (see the module docstring)."""

    emulates_devices = True
    #: Where the agents run and see the run's folder (None: this machine).
    host: ClassVar[AgentHost | None] = None
    #: Fork agents from a fork server (None: where the host allows; False: never).
    fork_server: ClassVar[bool | None] = None

    def __init__(self, config: RunConfig, network: Network, launch: Launch) -> None:
        super().__init__(config, network, launch)
        self.launch: Launch = launch
        self.folder = RunFolder(launch.out_dir.resolve())
        self.agents = AgentProcesses(
            config, self.folder, self.keeper, self.host, insecure=launch.insecure,
            fork_server=self.fork_server,
        )  # fmt: skip
        #: The embedded coordinator, once :meth:`start_coordinator` started it.
        self.coordinator: CoordinatorServer | None = None
        # The coordinator plays the runtime's after_round: it sees every agent's rounds.
        self._links = network.runtime(agent_ids(config.agents)) if network.round_driven else None

    def run(self) -> None:
        try:
            self.start_agents()
            self.agents.monitor(self.registered)
        finally:
            self.agents.terminate()
            self.close()

    @abstractmethod
    def start_agents(self) -> None:
        """Start what the agents need (a coordinator, namespaces...) and spawn them."""

    def close(self) -> None:
        """Close what :meth:`start_agents` started (called once the agents are stopped,
        whether or not it finished)."""
        if self.coordinator is not None:
            self.coordinator.stop(grace_s=0.5)

    def registered(self) -> int:
        """The agents that joined so far (the coordinator's count, else those started)."""
        if self.coordinator is not None:
            return self.coordinator.registered()
        return len(self.agents.agents)

    def start_coordinator(self, listen: str, *, metrics_note: str = "") -> str:
        """Start the embedded coordinator on ``listen`` (its metrics where the launch asks,
        said to the launcher with ``metrics_note``); return the address agents dial."""
        self.coordinator, address = start_embedded_coordinator(
            self, listen, self.agents.coordinator_credentials(), self._links, metrics_note
        )
        return address

    def stop(self) -> None:
        self.agents.stop()

    def records(self) -> dict[str, list[RoundRecord]]:
        return self.agents.records()

    @property
    def runtime(self) -> LinkRuntime | None:
        return self._links
