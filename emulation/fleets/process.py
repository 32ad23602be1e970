"""``process`` mode: one ``airgossip agent`` OS process per agent, an embedded coordinator,
real gRPC on loopback."""

from __future__ import annotations

from typing import ClassVar

from coordinator.run import RunSpec
from coordinator.service import CoordinatorServer
from edge.config.identity import agent_ids
from edge.observability.stats import RoundRecord
from emulation.config import RunConfig
from emulation.fleets.base import FleetProgress, Launch, ProgressKeeper
from emulation.fleets.processes import AgentProcesses
from emulation.networks import LinkRuntime, Network


class ProcessFleet:
    """Agents as OS processes that find each other through an embedded coordinator; each
    shapes its own links in the agent (the network's runtime). A graph that changes by round
    (``[switching]``) is switched by the coordinator, from the agents' round reports."""

    mode: ClassVar[str] = "process"
    summary: ClassVar[str] = "one OS process per agent, real gRPC, an embedded coordinator"
    in_process: ClassVar[bool] = False
    serves_metrics: ClassVar[bool] = True

    def __init__(self, config: RunConfig, network: Network, launch: Launch) -> None:
        self.config = config
        self.network = network
        self.launch = launch
        self.keeper = ProgressKeeper(config, launch.on_progress)
        self.agents = AgentProcesses(
            config, launch.out_dir, launch.config_path, self.keeper, insecure=launch.insecure
        )
        self._clock = network.wall_clock()
        # The coordinator plays the runtime's after_round: it sees every agent's rounds.
        self._links = network.runtime(agent_ids(config.agents)) if network.round_driven else None

    @classmethod
    def refuse(cls, config: RunConfig, network: Network) -> str | None:
        return None

    def run(self) -> None:
        server = CoordinatorServer(
            expected=self.config.agents,
            topology=self.network.topology(),
            listen=self.launch.coordinator_listen,
            metrics_listen=self.launch.coordinator_metrics_listen,
            security=self.agents.coordinator_credentials(),
            run=RunSpec(scenario=self.config.model_dump(mode="json"), rounds=self.config.rounds),
            switcher=self._links.switcher if self._links is not None else None,
        )
        address = server.start()
        if server.metrics_address:
            self.launch.notice(
                f"fleet metrics at http://{server.metrics_address}/metrics "
                "(service discovery /sd, fleet /fleet)"
            )
        try:
            for index, agent_id in enumerate(agent_ids(self.config.agents)):
                self.agents.spawn(index, agent_id, ["--coordinator", address])
            self.agents.monitor(server.registered)
        finally:
            self.agents.terminate()
            server.stop(grace_s=0.5)

    def stop(self) -> None:
        self.agents.stop()

    def progress(self) -> FleetProgress:
        return self.keeper.latest

    def records(self) -> dict[str, list[RoundRecord]]:
        return self.agents.records()

    def clock_s(self) -> float:
        return self._clock()

    @property
    def runtime(self) -> LinkRuntime | None:
        return self._links
