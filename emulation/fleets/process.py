"""``process`` mode: one ``airgossip agent`` OS process per agent, an embedded coordinator,
real gRPC on loopback."""

from __future__ import annotations

from typing import ClassVar

from coordinator.run import RunSpec
from coordinator.service import CoordinatorServer
from edge.identity import agent_ids
from edge.stats import RoundRecord
from emulation.config import RunConfig
from emulation.fleets.base import FleetProgress, Launch, ProgressKeeper, refuse_round_driven
from emulation.fleets.processes import AgentProcesses
from emulation.networks import LinkRuntime, Network


class ProcessFleet:
    """Agents as OS processes that find each other through an embedded coordinator; each
    shapes its own links in the agent (the network's runtime)."""

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

    @classmethod
    def refuse(cls, config: RunConfig, network: Network) -> str | None:
        return refuse_round_driven(cls.mode, network)

    def run(self) -> None:
        server = CoordinatorServer(
            expected=self.config.agents,
            topology=self.network.topology(),
            listen=self.launch.coordinator_listen,
            metrics_listen=self.launch.coordinator_metrics_listen,
            security=self.agents.coordinator_credentials(),
            run=RunSpec(scenario=self.config.model_dump(mode="json"), rounds=self.config.rounds),
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
            self.agents.monitor(server.fleet.registered)
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
        return None
