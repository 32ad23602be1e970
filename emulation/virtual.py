"""The virtual-clock backend: every agent in this process, driven by discrete events.

The same :class:`~edge.agent.Agent` phases as every other mode (``local_step``, ``push``,
the wait, ``mix``, ``report``), scheduled on a virtual clock: a local step takes the
scenario's ``compute_s``, a message arrives when the link model says it does, the wait
ends when :meth:`~edge.agent.Agent.neighbours_ready` says so or at its timeout. Nothing
sleeps, so a slow network of 1,000 agents runs as fast as the agents' own work allows, and
the run is deterministic for a seed (events at the same time run in the order they were
scheduled).
"""

from __future__ import annotations

import gc
import heapq
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from edge.agent import Agent, build_agent
from edge.stats import MemoryStatsSink, RoundRecord
from edge.transport.base import (
    GossipMessage,
    InboundHandler,
    LinkShaper,
    RejectCode,
    Rejected,
    SendCallback,
    SendOutcome,
)
from edge.transport.wire import wire_bytes
from emulation.config import RunConfig
from emulation.wireless import LinkFiguresSink, WirelessRun


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

    def run(self) -> None:
        queue = self._queue
        while queue:
            self.now, _, callback, args = heapq.heappop(queue)
            self.events += 1
            callback(*args)


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
        self.address = f"virtual://{agent_id}"
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
        receiver = address.removeprefix("virtual://")
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


ProgressFn = Callable[[int, list[Agent]], None]


class VirtualFleet:
    """All agents of a wireless scenario in this process, on a virtual clock.

    Parameters
    ----------
    config:
        A run config with a ``[wireless]`` table.
    on_round:
        Called with the slowest agent's round whenever it advances.
    journal:
        Keep every link verdict (see :class:`~emulation.wireless.WirelessLinkShaper`).
    """

    def __init__(
        self, config: RunConfig, on_round: ProgressFn | None = None, *, journal: bool = False
    ) -> None:
        if config.wireless is None:
            raise ValueError("the virtual-clock backend needs a [wireless] scenario")
        self.config = config
        self.wireless_settings = config.wireless
        self.on_round = on_round
        self.loop = EventLoop()
        self.sink = MemoryStatsSink()
        self.ids = [f"agent-{i}" for i in range(config.agents)]
        self.wireless = WirelessRun(
            config.wireless, self.ids, config.seed, self.loop.clock, journal=journal
        )
        self.agents: list[Agent] = []
        self._waiting: dict[str, int] = {}
        self._by_id: dict[str, Agent] = {}
        # How many agents have finished each round: the slowest round advances in O(1).
        self._finished_round = np.zeros(config.rounds + 2, dtype=np.int64)
        self._slowest = 0
        self._finished = 0

    @property
    def end_time_s(self) -> float:
        return self.loop.now

    def run(self) -> dict[str, list[RoundRecord]]:
        config, loop = self.config, self.loop
        settings = config.agent_settings()
        directory: dict[str, InboundHandler] = {}
        sink = LinkFiguresSink(self.sink, self.wireless.topology, loop.clock)
        for i, agent_id in enumerate(self.ids):
            transport = VirtualTransport(
                loop, directory, agent_id, shaper=self.wireless.shaper, on_event=self._check
            )
            agent = build_agent(
                agent_id, index=i, num_agents=config.agents, settings=settings,
                transport=transport, stats=sink, clock=loop.clock,
            )  # fmt: skip
            self.agents.append(agent)
            self._by_id[agent_id] = agent
        self._peers = {a.agent_id: a.start() for a in self.agents}
        self._update_graph()
        for agent in self.agents:
            agent.begin()
            loop.at(0.0, self._start_round, agent, 1)
        # The loop allocates millions of short-lived, acyclic objects (messages, tensors,
        # events) while the records it keeps pile up: the cyclic collector would rescan that
        # growing heap again and again (over 10% of a 1,000-agent run). Reference counting
        # frees everything here; one collection at the end picks up any stray cycle.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.no_grad():  # gossip arithmetic needs no autograd (training re-enables it)
                loop.run()
        finally:
            if collecting:
                gc.enable()
            for agent in self.agents:
                agent.close()
            gc.collect()
        return self.records()

    def records(self) -> dict[str, list[RoundRecord]]:
        out: dict[str, list[RoundRecord]] = {}
        for record in self.sink.records:
            out.setdefault(record.agent_id, []).append(record)
        return out

    # -- phases as events -------------------------------------------------------------------------
    def _update_graph(self) -> None:
        if self._finished == len(self.agents) and self.agents:
            return
        topology = self.wireless.topology
        graph = topology.graph(self.loop.now)
        for node, agent in enumerate(self.agents):
            agent.set_assignment(topology.assignment(graph, node, self._peers))
        self.loop.at(graph.time_s + topology.interval_s, self._update_graph)

    def _start_round(self, agent: Agent, round_index: int) -> None:
        agent.local_step(round_index)
        self.loop.at(
            self.loop.now + self.wireless_settings.compute_s, self._push, agent, round_index
        )

    def _push(self, agent: Agent, round_index: int) -> None:
        agent.push(round_index)
        timeout = agent.settings.wait_timeout_s
        if timeout <= 0:
            self._finish_round(agent, round_index)
            return
        self._waiting[agent.agent_id] = round_index
        self.loop.at(self.loop.now + timeout, self._timeout, agent, round_index)
        self._check(agent.agent_id)

    def _check(self, agent_id: str) -> None:
        round_index = self._waiting.get(agent_id)
        if round_index is None:
            return
        agent = self._by_id[agent_id]
        if agent.neighbours_ready(round_index):
            self._finish_round(agent, round_index)

    def _timeout(self, agent: Agent, round_index: int) -> None:
        if self._waiting.get(agent.agent_id) == round_index:
            self._finish_round(agent, round_index)

    def _finish_round(self, agent: Agent, round_index: int) -> None:
        self._waiting.pop(agent.agent_id, None)
        agent.mix(round_index)
        if agent._due(round_index):
            agent.report(round_index)
        self._finished_round[round_index] += 1
        if round_index < self.config.rounds:
            self.loop.at(self.loop.now, self._start_round, agent, round_index + 1)
        else:
            self._finished += 1
        slowest = self._slowest
        while slowest < self.config.rounds and self._finished_round[slowest + 1] == len(
            self.agents
        ):
            slowest += 1
        if slowest > self._slowest:
            self._slowest = slowest
            if self.on_round is not None:
                self.on_round(slowest, self.agents)
