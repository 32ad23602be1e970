"""A lock-step fleet of real agents over the in-memory transport, built from ``edge`` alone.

The agents are what every mode runs (``edge.agent.build_agent``: task, algorithm, codec,
admission checks, byte counts); only the loop is here. Links drop messages with a seeded
Bernoulli draw per message. A ``switcher`` (``edge.topology.switching``) may hand the fleet
new assignments between rounds.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from edge.agent import Agent, build_agent
from edge.algorithms import algorithm_class
from edge.seeds import derive_seed
from edge.settings import AgentSettings
from edge.stats import MemoryStatsSink, RoundRecord
from edge.topology import Assignment, Graph, assignments_for_graph, build_graph
from edge.transport import InMemoryNetwork, InMemoryTransport
from edge.transport.base import LinkVerdict


class BernoulliLoss:
    """Drops each message with probability ``loss``, the draw keyed by link and index."""

    def __init__(self, loss: float, seed: int) -> None:
        self.loss, self.seed = loss, seed

    def plan(self, sender: str, receiver: str, round: int, index: int, nbytes: int) -> LinkVerdict:
        if self.loss <= 0:
            return LinkVerdict()
        draw = random.Random(derive_seed(self.seed, sender, receiver, index)).random()
        return LinkVerdict(drop=draw < self.loss)


#: Called after every round with (round, fleet); may return new assignments by agent id.
Between = Callable[[int, "LockStepFleet"], dict[str, Assignment] | None]


@dataclass
class LockStepFleet:
    agents: list[Agent]
    addresses: dict[str, str]
    sink: MemoryStatsSink
    assignments: dict[str, Assignment] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        n: int,
        topology: str | Graph = "exponential",
        *,
        loss: float = 0.0,
        **settings: Any,
    ) -> LockStepFleet:
        agent_settings = AgentSettings.model_validate(settings)
        network, sink = InMemoryNetwork(), MemoryStatsSink()
        shaper = BernoulliLoss(loss, agent_settings.seed)
        agents = [
            build_agent(
                f"agent-{i}",
                index=i,
                num_agents=n,
                settings=agent_settings,
                transport=InMemoryTransport(network, f"agent-{i}", shaper=shaper),
                stats=sink,
            )
            for i in range(n)
        ]
        fleet = cls(agents, {a.agent_id: a.start() for a in agents}, sink)
        graph = topology if isinstance(topology, Graph) else build_graph(topology, n)
        fleet.assign(fleet.assignments_for(graph))
        return fleet

    @property
    def scheme(self) -> str:
        return algorithm_class(self.agents[0].algorithm.name).mixing

    def assignments_for(self, graph: Graph, epoch: int = 1) -> dict[str, Assignment]:
        return assignments_for_graph(graph, self.addresses, epoch=epoch, scheme=self.scheme)

    def assign(self, assignments: dict[str, Assignment]) -> None:
        self.assignments = assignments
        for agent in self.agents:
            agent.set_assignment(assignments[agent.agent_id])

    def run(self, rounds: int | None = None, *, between: Between | None = None) -> None:
        last = rounds or self.agents[0].settings.rounds
        first = self.agents[0].round + 1
        grad = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            if first == 1:
                for agent in self.agents:
                    agent.begin()
            for r in range(first, last + 1):
                for agent in self.agents:
                    agent.local_step(r)
                    agent.push(r)
                for agent in self.agents:
                    agent.mix(r)
                    if agent.report_due(r):
                        agent.report(r)
                if between is not None:
                    new = between(r, self)
                    if new is not None:
                        self.assign(new)
        finally:
            torch.set_grad_enabled(grad)

    # -- figures -----------------------------------------------------------------------------
    def latest(self) -> list[RoundRecord]:
        last: dict[str, RoundRecord] = {}
        for record in self.sink.records:
            if record.agent_id not in last or record.round >= last[record.agent_id].round:
                last[record.agent_id] = record
        return [last[a.agent_id] for a in self.agents]

    def at(self, round_index: int) -> list[RoundRecord]:
        return [r for r in self.sink.records if r.round == round_index]

    def mean(self, metric: str, records: list[RoundRecord] | None = None) -> float:
        return float(np.mean([r.metrics[metric] for r in records or self.latest()]))

    def estimates(self) -> list[torch.Tensor]:
        return [a.algorithm.estimate() for a in self.agents]

    def bytes_sent(self) -> int:
        return sum(a.counters().bytes_sent for a in self.agents)

    def consensus_distance(self) -> float:
        stack = torch.stack(self.estimates()).double()
        mean = stack.mean(dim=0)
        spread = float((stack - mean).norm(dim=1).mean())
        norm = float(mean.norm())
        return spread / norm if norm > 0 else spread

    def close(self) -> None:
        for agent in self.agents:
            agent.close()
