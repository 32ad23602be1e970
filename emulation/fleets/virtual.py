"""``virtual`` mode: every agent in this process, driven by discrete events on a virtual clock.

The same :class:`~airgossip.edge.agent.Agent` phases as every other mode (``local_step``,
``push``, the wait, ``mix``, ``report``), scheduled on a virtual clock: a local step takes
the scenario's ``compute_s`` (over the speed of the agent's ``[[device_classes]]`` class), a
message arrives when the link model says it does, the wait ends when
:meth:`~airgossip.edge.agent.Agent.neighbours_ready` says so or at its timeout. Nothing
sleeps, so a slow network of 1,000 agents runs as fast as the agents' own work allows, and
the run is deterministic for a seed (events at the same time run in the order they were
scheduled).
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import itertools
from collections import defaultdict
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from airgossip.common.identity import agent_ids
from airgossip.common.topology import Assignment
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.agent.mixing_steps import StepWaits
from airgossip.edge.energy import EnergyLedger
from airgossip.edge.observability.stats import Counters, MemoryStatsSink, RoundRecord, StatsSink
from airgossip.edge.transport.base import (
    GossipMessage,
    InboundHandler,
    LinkShaper,
    RejectCode,
    Rejected,
    SendCallback,
    SendOutcome,
)
from airgossip.edge.transport.wire import wire_bytes
from airgossip.emulation.fleets.base import (
    AgentProgress,
    Fleet,
    Launch,
    fleet_progress,
    group_records,
)
from airgossip.emulation.fleets.virtual_fast import VirtualPushSum, fast_refusal
from airgossip.emulation.networks import LinkRuntime, Network
from airgossip.node.privacy import privacy_context, run_keyring
from airgossip.scenario.config import RunConfig


class EventLoop:
    """A discrete-event loop: callbacks at virtual times, FIFO among equal times."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.events = 0

    def clock(self) -> float:
        return self.now

    def at(self, time_s: float, callback: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._queue, (max(time_s, self.now), next(self._seq), callback, args))

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Run events in time order until none is left (or ``until()`` says stop; it is
        asked every thousand events)."""
        queue, pop, events = self._queue, heapq.heappop, self.events
        try:
            while queue:
                self.now, _, callback, args = pop(queue)
                events += 1
                callback(*args)
                if events % 1000 == 0 and until is not None and until():
                    return
        finally:
            self.events = events


#: Where a virtual agent is reached: ``virtual://<id>``.
VIRTUAL_SCHEME = "virtual://"


def virtual_address(agent_id: str) -> str:
    """The address of agent ``agent_id`` on the virtual clock."""
    return VIRTUAL_SCHEME + agent_id


class VirtualTransport:
    """A transport whose messages take virtual time: the link shaper's delay, then delivery
    (and the sender's acknowledgement) as one event."""

    def __init__(
        self,
        loop: EventLoop,
        directory: dict[str, InboundHandler],
        agent_id: str,
        *,
        shaper: LinkShaper | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.loop = loop
        self.directory = directory
        self.agent_id = agent_id
        self.shaper = shaper
        self.on_event = on_event
        self.address = virtual_address(agent_id)
        self._counters: dict[str, int] = {}

    def start(self, handler: InboundHandler) -> str:
        self.directory[self.address] = handler
        return self.address

    def send(self, peer: str, address: str, message: GossipMessage, done: SendCallback) -> None:
        index = self._counters.get(peer, 0)
        self._counters[peer] = index + 1
        nbytes = wire_bytes(message)
        drop, delay = False, 0.0
        if self.shaper is not None:
            verdict = self.shaper.plan(self.agent_id, peer, message.header.round, index, nbytes)
            drop, delay = verdict.drop, verdict.delay_s
        if drop:
            self.loop.at(
                self.loop.now + delay,
                self._finish,
                done,
                SendOutcome(False, nbytes, dropped=True),
                None,
            )
        else:
            self.loop.at(self.loop.now + delay, self._deliver, address, message, nbytes, done)

    def _deliver(
        self, address: str, message: GossipMessage, nbytes: int, done: SendCallback
    ) -> None:
        handler = self.directory.get(address)
        receiver = address.removeprefix(VIRTUAL_SCHEME)
        if handler is None:
            error = Rejected(RejectCode.UNAVAILABLE, f"no agent at {address}")
            self._finish(done, SendOutcome(False, nbytes, error=error), None)
            return
        try:
            handler.admit(message.header)
            ack = handler.deliver(message)
        except Rejected as err:
            self._finish(done, SendOutcome(False, nbytes, error=err), receiver)
            return
        self._finish(done, SendOutcome(True, nbytes, ack=ack), receiver)

    def _finish(self, done: SendCallback, outcome: SendOutcome, receiver: str | None) -> None:
        done(outcome)
        if self.on_event is not None:
            self.on_event(self.agent_id)
            if receiver is not None:
                self.on_event(receiver)

    def close(self) -> None:
        self.directory.pop(self.address, None)


class VirtualFleet(Fleet):
    """All agents in this process, on a virtual clock: deterministic for a seed, as fast as
    the agents' own work allows (nothing sleeps).

    ``fast``: run push-sum consensus without :class:`Agent` objects
    (:class:`~airgossip.emulation.fleets.virtual_fast.VirtualPushSum`: the same events, verdicts and
    figures). None: wherever :func:`~airgossip.emulation.fleets.virtual_fast.fast_refusal` allows;
    True: insist (``ValueError`` naming why not); False: always the agents themselves."""

    mode: ClassVar[str] = "virtual"
    in_process: ClassVar[bool] = True
    emulates_devices = True

    def __init__(
        self,
        config: RunConfig,
        network: Network,
        launch: Launch | None = None,
        *,
        fast: bool | None = None,
    ) -> None:
        refusal = fast_refusal(config, network) if fast is not False else "not asked"
        if fast and refusal is not None:
            raise ValueError(f"this run cannot take the fast path: {refusal}")
        super().__init__(config, network, launch)
        self.fast = refusal is None
        self._fast: VirtualPushSum | None = None
        self.loop = EventLoop()
        self.sink = MemoryStatsSink()
        self.ids = agent_ids(config.agents)
        self.links = network.runtime(self.ids, self.loop.clock, journal=network.record)
        #: Each agent's local step on the virtual clock: the network's ``compute_s`` over its
        #: device class's speed.
        self.devices = config.device_assignment()
        self.step_s = [network.compute_s * d.stretch for d in self.devices]
        self._step_s = dict(zip(self.ids, self.step_s, strict=True))
        self._timeouts = {
            agent_id: config.wait_timeout_of(i) for i, agent_id in enumerate(self.ids)
        }
        #: When each agent whose device is sometimes off is on (virtual seconds).
        self._online = {
            agent_id: schedule
            for i, agent_id in enumerate(self.ids)
            if (schedule := config.online_schedule(i)) is not None
        }
        self.agents: list[Agent] = []
        #: agent -> the wait it is in: (round, gossip step, stage), see _await.
        self._waiting: dict[str, tuple[int, int, int]] = {}
        self._waited_from: dict[str, float] = {}  # agent -> when its current wait began
        self._step_waits: dict[str, StepWaits] = defaultdict(StepWaits)
        self._by_id: dict[str, Agent] = {}
        # How many agents have finished each round: the slowest round advances in O(1).
        self._finished_round = np.zeros(config.rounds + 2, dtype=np.int64)
        self._slowest = 0
        self._finished = 0
        self._stop = False
        self._seen = 0
        self._counters: dict[str, Counters] = {}
        #: What the agents reported for each round the slowest agent has not finished.
        self._reported: dict[int, list[RoundRecord]] = {}

    @classmethod
    def refuse(cls, config: RunConfig, network: Network) -> str | None:
        if not network.time_varying and not network.round_driven:
            return (
                f"mode 'virtual' runs a network that changes with time (or by round, with "
                f"[switching]) on a virtual clock; the {network.describe()} network does neither "
                "(give --scenario NAME|FILE for a wireless one, or use --mode inproc)"
            )
        return None

    def run(self) -> None:
        config, loop = self.config, self.loop
        settings = config.agent_settings()
        directory: dict[str, InboundHandler] = {}
        sink = self.links.sink(self.sink)
        # Steps are asked in time order here: the next can be computed while this one runs.
        self.links.compute_ahead()
        if self.fast:
            self._run_fast(sink)
            return
        keys = run_keyring(config, self.ids)
        for i, agent_id in enumerate(self.ids):
            transport = VirtualTransport(
                loop, directory, agent_id, shaper=self.links.shaper, on_event=self._check
            )
            agent = build_agent(
                agent_id, index=i, num_agents=config.agents, settings=settings,
                transport=transport, stats=sink, clock=loop.clock,
                privacy=privacy_context(config, self.network, self.ids, keys.get(agent_id)),
            )  # fmt: skip
            power = self.devices[i].power_model()
            if power is not None:
                agent.energy = EnergyLedger(agent_id, power, self.links.rate_bps)
            self.agents.append(agent)
            self._by_id[agent_id] = agent
        self._peers = {a.agent_id: a.start() for a in self.agents}
        self._update_graph()
        for agent in self.agents:
            agent.begin()
            loop.at(0.0, self._start_round, agent, 1)
        self._run_loop()

    def _run_fast(self, sink: StatsSink | None) -> None:
        self._fast = fast = VirtualPushSum(
            self.config, self.ids, loop=self.loop, shaper=self.links.shaper,
            step_s=self.step_s, sink=sink, round_done=self._round_done,
        )  # fmt: skip
        self._peers = {agent_id: virtual_address(agent_id) for agent_id in self.ids}
        self._update_graph()
        fast.begin()
        self._run_loop()

    def _run_loop(self) -> None:
        """Run the event loop to its end, then close the agents (none on the fast path).

        The loop allocates millions of short-lived, acyclic objects (messages, tensors,
        events) while the records it keeps pile up: the cyclic collector would rescan that
        growing heap again and again (over 10% of a 1,000-agent run). Reference counting
        frees everything here; one collection at the end picks up any stray cycle."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.no_grad():  # gossip arithmetic needs no autograd (training re-enables it)
                self.loop.run(until=lambda: self._stop)
        finally:
            if collecting:
                gc.enable()
            for agent in self.agents:
                agent.close()
            gc.collect()

    def stop(self) -> None:
        # The event loop reads a plain attribute between events: cheaper than the event.
        self._stop = True
        super().stop()

    def records(self) -> dict[str, list[RoundRecord]]:
        return group_records(self.sink.records)

    def clock_s(self) -> float:
        """Seconds on the virtual clock."""
        return self.loop.now

    @property
    def runtime(self) -> LinkRuntime | None:
        return self.links

    # -- phases as events -------------------------------------------------------------------------
    def _update_graph(self) -> None:
        if self._finished == len(self.ids) and self.ids:
            return
        now = self.loop.now
        assignments = self.links.assignments(now, self._peers)
        self._assign(assignments)
        change = self.links.next_change_s(now)
        if change is not None:
            self.loop.at(change, self._update_graph)

    def _start_round(self, agent: Agent, round_index: int) -> None:
        online = self._online.get(agent.agent_id)
        if online is not None:
            back = online.next_online(self.loop.now)
            agent.offline = back > self.loop.now
            if agent.offline:  # off: nothing until it is on again
                self.loop.at(back, self._start_round, agent, round_index)
                return
        agent.local_step(round_index)
        step_s = self._step_s[agent.agent_id]
        if agent.energy is not None:
            agent.energy.computed(step_s)
        self.loop.at(self.loop.now + step_s, self._push, agent, round_index)

    def _push(self, agent: Agent, round_index: int, step: int = 0) -> None:
        agent.push(round_index, step)
        timeout = self._timeouts[agent.agent_id]
        if timeout <= 0:
            self._finish_step(agent, round_index, step)
            return
        self._await(agent, (round_index, step, 0), timeout)

    def _await(self, agent: Agent, waiting: tuple[int, int, int], timeout: float) -> None:
        """Wait for ``waiting`` (round, gossip step, stage: 0 for
        :meth:`~airgossip.edge.agent.agent.Agent.neighbours_ready`, 1 for a further step's
        :meth:`~airgossip.edge.agent.agent.Agent.step_heard`) at most ``timeout``."""
        self._waiting[agent.agent_id] = waiting
        self._waited_from[agent.agent_id] = self.loop.now
        self.loop.at(self.loop.now + timeout, self._timeout, agent, waiting)
        self._check(agent.agent_id)

    def _check(self, agent_id: str) -> None:
        waiting = self._waiting.get(agent_id)
        if waiting is None:
            return
        agent = self._by_id[agent_id]
        round_index, step, stage = waiting
        if stage == 0 and agent.neighbours_ready(round_index, step):
            self._waited(agent, waiting)
        elif stage == 1 and agent.step_heard(round_index, step):
            self._step_waits[agent_id].waited(self.loop.now - self._waited_from[agent_id],
                                              heard=True)  # fmt: skip
            self._waited(agent, waiting)

    def _timeout(self, agent: Agent, waiting: tuple[int, int, int]) -> None:
        if self._waiting.get(agent.agent_id) == waiting:
            self._waited(agent, waiting)

    def _waited(self, agent: Agent, waiting: tuple[int, int, int]) -> None:
        """A stage of a step's wait is over: a further step then waits for its
        in-neighbours' same step (see StepWaits), else the step is done."""
        round_index, step, stage = waiting
        self._waiting.pop(agent.agent_id, None)
        if stage == 0 and step > 0:
            longest = self._step_waits[agent.agent_id].timeout(self._timeouts[agent.agent_id])
            self._await(agent, (round_index, step, 1), longest)
            return
        self._finish_step(agent, round_index, step)

    def _finish_step(self, agent: Agent, round_index: int, step: int) -> None:
        """The wait of gossip step ``step`` of ``round_index`` is over: mix, then the round's
        next step or its end."""
        agent.mix(round_index, step)
        if step + 1 < agent.mixing_steps:
            self.loop.at(self.loop.now, self._push, agent, round_index, step + 1)
            return
        self._finish_round(agent, round_index)

    def _finish_round(self, agent: Agent, round_index: int) -> None:
        depleted = agent.energy is not None and agent.energy.depleted
        due = agent.report_due(round_index) or depleted
        record = agent.report(round_index, final=depleted) if due else None
        if depleted and round_index < self.config.rounds:
            self._leave(agent, round_index, record)
            return
        if round_index < self.config.rounds:
            self.loop.at(self.loop.now, self._start_round, agent, round_index + 1)
        self._round_done(round_index, record)

    def _leave(self, agent: Agent, round_index: int, record: RoundRecord | None) -> None:
        """``agent``'s battery ran out in ``round_index``: it leaves as a dead device does
        (its messages refused as unavailable from now on), counted as done with every round
        the others still run."""
        agent.close()
        self._round_done(round_index, record)
        for later in range(round_index + 1, self.config.rounds + 1):
            self._round_done(later, None)

    def _round_done(self, round_index: int, record: RoundRecord | None) -> None:
        """An agent finished ``round_index`` (``record``: its report, if the round is
        reported): the slowest round advances when every agent has finished it."""
        if record is not None:
            self._reported.setdefault(round_index, []).append(record)
        self._finished_round[round_index] += 1
        if round_index >= self.config.rounds:
            self._finished += 1
        slowest, n = self._slowest, len(self.ids)
        while slowest < self.config.rounds and self._finished_round[slowest + 1] == n:
            slowest += 1
        if slowest > self._slowest:
            for done in range(self._slowest + 1, slowest + 1):
                self._after_round(done)
            self._slowest = slowest
            self._report_progress()

    def _after_round(self, round_index: int) -> None:
        """Every agent has finished ``round_index``: the network may switch the graph (agents
        already further along take the new one from where they are)."""
        reported = self._reported.pop(round_index, [])
        switched = self.links.after_round(round_index, reported, self._peers)
        if switched is not None:
            self._assign(switched)

    def _assign(self, assignments: dict[str, Assignment]) -> None:
        if self._fast is not None:
            self._fast.assign(assignments)
            return
        for agent in self.agents:
            agent.set_assignment(assignments[agent.agent_id])

    def _report_progress(self) -> None:
        slowest, final = self._slowest, self._slowest == self.config.rounds
        records = self.sink.records
        for record in records[self._seen :]:
            self._counters[record.agent_id] = record.counters
        self._seen = len(records)
        # The counts of the agents' latest records, which the summary is made of too: a
        # push still in flight when its sender reported its last round is in neither.
        states = [
            AgentProgress(slowest, final, None, self._counters.get(agent_id, Counters()))
            for agent_id in self.ids
        ]
        progress = fleet_progress(self.config, states, len(self.ids))
        self.keeper.update(dataclasses.replace(progress, emulated_s=self.loop.now))
