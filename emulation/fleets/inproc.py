"""``inproc`` mode: every agent in this process, driven in lock step over the in-memory
transport; deterministic for a seed. Consensus by push-sum on a static graph runs batched
(:mod:`.batched`: the same figures, array operations over all agents at once)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from airgossip.common.identity import agent_ids
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.observability.stats import Counters, MemoryStatsSink, RoundRecord
from airgossip.edge.transport import InMemoryNetwork, InMemoryTransport
from airgossip.emulation.fleets.base import (
    AgentProgress,
    Fleet,
    Launch,
    fleet_progress,
    group_records,
)
from airgossip.emulation.fleets.batched import BatchedPushSum, batched_refusal
from airgossip.emulation.networks import LinkRuntime, Network
from airgossip.node.privacy import privacy_context, run_keyring
from airgossip.scenario.config import RunConfig


class InProcessFleet(Fleet):
    """All agents in this process, in lock step: every agent's local step and push, then
    every agent's mix and report, round after round. There is no clock, so a network whose
    links change with time cannot run here (the virtual mode runs those).

    After :meth:`run` the agents stay in :attr:`agents` (closed, their algorithms, tasks and
    assignments readable) for checks that need more than the records.

    ``batched``: run consensus by push-sum on a static graph as array operations over all
    agents (:class:`~airgossip.emulation.fleets.batched.BatchedPushSum`; no :class:`Agent` objects
    are built, :attr:`agents` stays empty). None (the default): wherever it applies and nothing asks
    for the agents (:attr:`after_build`); False: never; True: required.
    """

    mode = "inproc"
    in_process = True

    def __init__(
        self,
        config: RunConfig,
        network: Network,
        launch: Launch | None = None,
        *,
        batched: bool | None = None,
    ) -> None:
        super().__init__(config, network, launch)
        self.batched = batched
        self.sink = MemoryStatsSink()
        self.agents: list[Agent] = []
        self.round = 0
        self._seen = 0
        self._accuracy: dict[str, float] = {}
        self._counters: dict[str, Counters] = {}
        self._runtime = network.runtime(agent_ids(config.agents), clock=lambda: 0.0)
        #: Called with the built agents before the first round (harnesses that turn some of
        #: them into insiders: emulation/attacks.py).
        self.after_build: Callable[[list[Agent]], None] | None = None

    @classmethod
    def refuse(cls, config: RunConfig, network: Network) -> str | None:
        if network.time_varying:
            return (
                f"mode 'inproc' runs agents in lock step with no clock, and the "
                f"{network.describe()} network changes with time: use --mode virtual (a "
                "virtual clock, deterministic) or process"
            )
        return None

    def run(self) -> None:
        if self.batched is not False:
            batch = self._batch()
            if batch is not None:
                self._run_batched(batch)
                return
        config, runtime = self.config, self._runtime
        network = InMemoryNetwork()
        sink = runtime.sink(self.sink)
        ids = agent_ids(config.agents)
        keys = run_keyring(config, ids)
        agents = self.agents = [
            build_agent(
                agent_id,
                index=i,
                num_agents=config.agents,
                settings=config.agent_settings(),
                transport=InMemoryTransport(network, agent_id, shaper=runtime.shaper),
                stats=sink,
                privacy=privacy_context(config, self.network, ids, keys.get(agent_id)),
            )
            for i, agent_id in enumerate(ids)
        ]
        if self.after_build is not None:
            self.after_build(agents)
        addresses = {a.agent_id: a.start() for a in agents}
        assignments = runtime.assignments(0.0, addresses)
        for agent in agents:
            agent.set_assignment(assignments[agent.agent_id])
            agent.begin()
        grad = torch.is_grad_enabled()
        torch.set_grad_enabled(False)  # gossip needs no autograd (training re-enables it)
        try:
            for round_index in range(1, config.rounds + 1):
                if self.stopping.is_set():
                    break
                for agent in agents:
                    agent.local_step(round_index)
                    agent.push(round_index)
                for step in range(1, max(a.mixing_steps for a in agents)):
                    # A round's further gossip steps, in lock step too.
                    taking = [a for a in agents if step < a.mixing_steps]
                    for agent in taking:
                        agent.mix(round_index, step - 1)
                    for agent in taking:
                        agent.push(round_index, step)
                reported = []
                for agent in agents:
                    agent.mix(round_index, agent.mixing_steps - 1)
                    if agent.report_due(round_index):
                        reported.append(agent.report(round_index))
                switched = runtime.after_round(round_index, reported, addresses)
                if switched is not None:  # the next round runs on the schedule's next graph
                    for agent in agents:
                        agent.set_assignment(switched[agent.agent_id])
                self.round = round_index
                self._report_progress([a.agent_id for a in agents])
        finally:
            torch.set_grad_enabled(grad)
            for agent in agents:
                agent.close()

    def _batch(self) -> BatchedPushSum | None:
        """The batched fleet of this run, where it applies (see the class docstring)."""
        network = self.network
        refusal = batched_refusal(self.config, network)
        if refusal is None and self.after_build is not None:
            refusal = "the agents are asked for (after_build)"
        if refusal is not None:
            if self.batched:
                raise ValueError(f"this run cannot be batched: {refusal}")
            return None
        ids, graph = agent_ids(self.config.agents), network.first_graph()
        return BatchedPushSum(self.config, network, graph, ids, self._runtime.sink(self.sink))

    def _run_batched(self, batch: BatchedPushSum) -> None:
        batch.begin()
        for round_index in range(1, self.config.rounds + 1):
            if self.stopping.is_set():
                break
            batch.round(round_index)
            self.round = round_index
            self._report_progress(batch.ids)

    def _report_progress(self, ids: list[str]) -> None:
        records = self.sink.records
        for record in records[self._seen :]:
            if "accuracy" in record.metrics:
                self._accuracy[record.agent_id] = record.metrics["accuracy"]
            self._counters[record.agent_id] = record.counters
        self._seen = len(records)
        final = self.round == self.config.rounds
        # The counts of the agents' latest records, which the summary is made of too.
        states = [
            AgentProgress(
                self.round, final, self._accuracy.get(agent_id),
                self._counters.get(agent_id, Counters()),
            )
            for agent_id in ids
        ]  # fmt: skip
        self.keeper.update(fleet_progress(self.config, states, len(ids)))

    def records(self) -> dict[str, list[RoundRecord]]:
        return group_records(self.sink.records)

    def clock_s(self) -> float:
        return 0.0

    @property
    def runtime(self) -> LinkRuntime | None:
        return self._runtime


def run_in_process(
    config: RunConfig, *, batched: bool | None = None
) -> dict[str, list[RoundRecord]]:
    """Run ``config``'s fleet in lock step in this process (no output folder, no results
    file) and return every agent's records: for notebooks, tests and benchmarks
    (``batched``: as :class:`InProcessFleet` takes it)."""
    from airgossip.emulation.networks import network_for

    fleet = InProcessFleet(config, network_for(config), batched=batched)
    fleet.run()
    return fleet.records()
