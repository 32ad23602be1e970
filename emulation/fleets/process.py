"""``process`` mode: one agent OS process per agent, an embedded coordinator, real gRPC on
loopback."""

from __future__ import annotations

from airgossip.common.identity import agent_ids
from airgossip.emulation.fleets.agent_fleet import AgentProcessFleet
from airgossip.node.command import AgentCommand


class ProcessFleet(AgentProcessFleet):
    """Agents as OS processes that find each other through an embedded coordinator; each
    shapes its own links in the agent (the network's runtime). A graph that changes by round
    (``[switching]``) is switched by the coordinator, from the agents' round reports."""

    mode = "process"
    serves_metrics = True

    def start_agents(self) -> None:
        address = self.start_coordinator(self.launch.coordinator_listen)
        for index, agent_id in enumerate(agent_ids(self.config.agents)):
            self.agents.spawn(index, agent_id, AgentCommand(coordinator=address))
