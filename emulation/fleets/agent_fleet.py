"""The base of fleets whose agents are OS processes (``process``, ``namespaces``,
``containers``): what they share, written once.

An :class:`AgentProcessFleet` holds the run's :class:`~emulation.runtime.folder.RunFolder`
and an :class:`~emulation.fleets.processes.AgentProcesses` group; its records, progress and
stopping come from the group. :meth:`~AgentProcessFleet.run` starts the agents
(:meth:`~AgentProcessFleet.start_agents`, the one thing every mode writes), follows them to
the end, then stops them and closes what the mode started
(:meth:`~AgentProcessFleet.close`), whatever happened. A mode whose agents find each other
through a coordinator starts the embedded one (:meth:`~AgentProcessFleet.start_coordinator`),
which also switches a graph that changes by round (``[switching]``): it sees every agent's
round reports.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

from coordinator.run import RunSpec
from coordinator.service import CoordinatorServer
from edge.config.identity import agent_ids
from edge.observability.stats import RoundRecord
from emulation.config import RunConfig
from emulation.fleets.base import FleetBase, Launch
from emulation.fleets.processes import AgentHost, AgentProcesses
from emulation.networks import LinkRuntime, Network
from emulation.runtime.folder import RunFolder


class AgentProcessFleet(FleetBase):
    """A fleet of agent processes (see the module docstring)."""

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
        self.coordinator = CoordinatorServer(
            expected=self.config.agents,
            topology=self.network.topology(),
            listen=listen,
            metrics_listen=self.launch.coordinator_metrics_listen,
            security=self.agents.coordinator_credentials(),
            run=RunSpec(scenario=self.config.model_dump(mode="json"), rounds=self.config.rounds),
            switcher=self._links.switcher if self._links is not None else None,
        )
        address = self.coordinator.start()
        if self.coordinator.metrics_address:
            self.launch.notice(
                f"fleet metrics at http://{self.coordinator.metrics_address}/metrics "
                f"(service discovery /sd, fleet /fleet{metrics_note})"
            )
        return address

    def stop(self) -> None:
        self.agents.stop()

    def records(self) -> dict[str, list[RoundRecord]]:
        return self.agents.records()

    @property
    def runtime(self) -> LinkRuntime | None:
        return self._links
