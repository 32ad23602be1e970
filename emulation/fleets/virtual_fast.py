"""Push-sum consensus on the virtual clock without :class:`~airgossip.edge.agent.Agent` objects.

:class:`~airgossip.emulation.fleets.virtual.VirtualFleet` runs every agent's phases as events; per
message the agent shares, encodes, the link shaper decides, the receiver admits, decodes,
checks and absorbs, and the acknowledgement comes back: about 100 us of Python, most of it
the agents' own. For the workload of :func:`~airgossip.emulation.fleets.batched.workload_refusals`
(``consensus``, ``push-sum`` without compression, float64, no options or privacy) none of
that varies between agents, so :class:`VirtualPushSum` keeps every agent's ``(x, y)`` and
pending mass as rows of arrays and every edge's running sum, sequence numbers and the
receiver's view of it in lists by edge, and runs the same events in the same order at the
same virtual times: the link shaper is asked the same questions (sender, receiver, round,
message index, wire bytes as the encoded message would take), so every verdict, delay and
virtual time is the per-agent path's. What an agent decides (shares held back for refusing
peers and when starved, which edges carry a message, where a message stands on its edge and
whether it is absorbed, who it still hears after a graph change, when its wait is over) is
decided by the agent's own rules (:mod:`airgossip.edge.algorithms.push_sum_rules`,
:func:`~airgossip.edge.agent.pacing.wait_over`) on the same Python floats; only the vector
arithmetic is numpy's instead of torch's (a running sum's ``+= x * w`` may differ in the
last bit where torch fuses the multiply-add). tests/emulation/test_virtual_fast.py checks
drops, counters and times exactly, estimates within 1e-9.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from airgossip.common.topology import Assignment
from airgossip.edge.agent.admission import FORMER_ROUNDS
from airgossip.edge.agent.pacing import wait_over
from airgossip.edge.algorithms.push_sum_rules import (
    Placement,
    absorbs,
    flushes,
    hold_back_weights,
    numbered,
    pending_weight,
    placement,
    rebases,
    starved,
)
from airgossip.edge.observability.stats import Counters, RoundRecord, StatsSink, probe_estimate
from airgossip.edge.tasks.consensus import ConsensusOptions, consensus_vector
from airgossip.edge.tasks.options import parse_options
from airgossip.edge.transport.base import LinkShaper
from airgossip.emulation.fleets.batched import WireSizes, workload_refusals
from airgossip.emulation.networks import Network
from airgossip.emulation.networks.shaper import WirelessLinkShaper
from airgossip.scenario.config import RunConfig


class _Loop(Protocol):
    """The event loop (:class:`~airgossip.emulation.fleets.virtual.EventLoop`)."""

    now: float

    def at(self, time_s: float, callback: Callable[..., None], *args: Any) -> None: ...


#: What the fleet hears of a finished round: ``(round, the agent's record or None)``.
RoundDone = Callable[[int, RoundRecord | None], None]


def fast_refusal(config: RunConfig, network: Network) -> str | None:
    """Why ``config`` cannot run on :class:`VirtualPushSum` (None: it can): the batched
    workload (:func:`~airgossip.emulation.fleets.batched.workload_refusals`, whatever the network
    decides per message) on a network whose graph changes with time only (one that
    switches by round hands agents new assignments between rounds)."""
    reasons = workload_refusals(config, network)
    if network.round_driven:
        reasons.append("the graph switches by round")
    if any(d.power_model() is not None for d in config.device_classes):
        reasons.append("device classes draw power (the agents keep the energy ledger)")
    if any(d.availability.kind != "always" for d in config.device_classes):
        reasons.append("devices are sometimes off (the agents refuse messages then)")
    return "; ".join(reasons) or None


class _Edge:
    """One directed edge: the sender's running sum and the receiver's view of it."""

    __slots__ = (
        "acked",
        "base",
        "count",
        "dst",
        "in_base",
        "inflight",
        "last_seq",
        "peer",
        "receiver",
        "rho_x",
        "rho_y",
        "sender",
        "sent",
        "seq",
        "sigma_x",
        "sigma_y",
    )  # fmt: skip

    def __init__(self, sender: _Agent, receiver: _Agent, peer: str, dim: int) -> None:
        self.sender, self.receiver, self.peer = sender, receiver, peer
        self.dst = receiver.index
        self.sigma_x = np.zeros(dim)
        self.sigma_y = 0.0
        self.seq = self.base = self.acked = 0
        #: The latest message: (seq, what it carried); None once acknowledged or cleared.
        self.sent: tuple[int, np.ndarray, float] | None = None
        self.count = 0  # messages so far (the shaper's message index)
        self.inflight = False
        self.rho_x: np.ndarray | None = None  # None: the receiver holds no in-edge yet
        self.rho_y = 0.0
        self.last_seq = self.in_base = 0


class _Agent:
    """One agent's bookkeeping besides its row of the arrays."""

    __slots__ = (
        "agent_id",
        "counters",
        "epoch",
        "former",
        "heard",
        "hears",
        "incoming",
        "index",
        "inflight",
        "out",
        "pending_x",
        "pending_y",
        "refusing",
        "round",
        "schedule",
        "x",
        "y",
    )  # fmt: skip

    def __init__(self, index: int, agent_id: str) -> None:
        self.index, self.agent_id = index, agent_id
        self.round = 0
        self.y, self.pending_y = 1.0, 0.0
        #: Its rows of the fleet's arrays (views: updated in place).
        self.x = self.pending_x = np.zeros(0)
        self.out: dict[int, _Edge] = {}  # in the order the agent's out-edges were made
        self.epoch = 0
        #: Per phase: self weight, out weights and in-neighbours, by agent index.
        self.schedule: list[tuple[float, dict[int, float], tuple[int, ...]]] = [(1.0, {}, ())]
        #: The in-neighbours of its round's phase (the round it pushes or waits in).
        self.incoming: tuple[int, ...] = ()
        self.hears: frozenset[int] = frozenset()
        self.former: dict[int, int] = {}
        self.heard: dict[int, int] = {}
        self.refusing: set[int] = set()
        self.inflight = 0
        # bytes, sent, dropped, failed, received, rejected
        self.counters = [0, 0, 0, 0, 0, 0]


class VirtualPushSum:
    """The agents of a :class:`~airgossip.emulation.fleets.virtual.VirtualFleet` as arrays (see the
    module docstring), on the fleet's event loop, link shaper and sink; every finished
    round goes to ``round_done`` (the fleet's bookkeeping of the slowest round)."""

    def __init__(
        self,
        config: RunConfig,
        ids: list[str],
        *,
        loop: _Loop,
        shaper: LinkShaper | None,
        step_s: Sequence[float],
        sink: StatsSink | None,
        round_done: RoundDone,
    ) -> None:
        self.config, self.ids, self.loop, self.sink = config, ids, loop, sink
        self.step_s, self.round_done = step_s, round_done
        self.index = {agent_id: i for i, agent_id in enumerate(self.ids)}
        n = len(self.ids)
        options = parse_options(ConsensusOptions, config.task.options, "consensus")
        self.x = np.stack([consensus_vector(config.seed, i, options).numpy() for i in range(n)])
        self.dim = self.x.shape[1]
        self.pending_x = np.zeros_like(self.x)
        self.agents = [_Agent(i, agent_id) for i, agent_id in enumerate(self.ids)]
        for a in self.agents:
            a.x, a.pending_x = self.x[a.index], self.pending_x[a.index]
        settings = config.agent_settings()
        self.rounds, self.staleness = config.rounds, settings.staleness
        self.reports = settings.reports
        self.timeouts = [config.wait_timeout_of(i) for i in range(n)]
        self.asynchronous = settings.pace == "async"
        self.seed = settings.seed
        self.shaper = shaper
        self.sizes = WireSizes(config, self.ids, self.dim)
        self.waiting: dict[int, int] = {}

    # -- what the fleet calls ---------------------------------------------------------------------
    def assign(self, assignments: dict[str, Assignment]) -> None:
        """Install every agent's assignment (as :meth:`Agent.set_assignment` does)."""
        index = self.index
        for a in self.agents:
            assignment = assignments[a.agent_id]
            # one entry per phase of a periodic graph; round r uses phase r % period
            a.schedule = [
                (phase.self_weight, {index[p]: w for p, w in phase.out_weights.items()},
                 tuple(index[p] for p in phase.in_neighbours))
                for phase in assignment.schedule
            ]  # fmt: skip
            incoming = frozenset(p for _, _, heard in a.schedule for p in heard)
            for p in a.hears - incoming:
                a.former[p] = a.round
            for p in incoming:
                a.former.pop(p, None)
            a.hears, a.epoch = incoming, assignment.epoch
            a.incoming = a.schedule[a.round % len(a.schedule)][2]

    def begin(self) -> None:
        for a in self.agents:
            self.report(a, 0)
            self.loop.at(0.0, self._start_round, a, 1)

    # -- phases as events -------------------------------------------------------------------------
    def _start_round(self, a: _Agent, round_index: int) -> None:
        self.loop.at(self.loop.now + self.step_s[a.index], self._push, a, round_index)

    def _push(self, a: _Agent, round_index: int) -> None:
        a.round = round_index
        i, loop, ids = a.index, self.loop, self.ids
        self_w, weights, a.incoming = a.schedule[round_index % len(a.schedule)]
        if a.refusing:  # refusing peers' shares stay home, they stay in the phase
            kept = hold_back_weights(self_w, weights, a.refusing, probe=True)
            if kept is not None:
                self_w, weights = kept
        if starved(a.y):  # every share stays home
            kept = hold_back_weights(self_w, weights, weights, probe=False)
            if kept is not None:
                self_w, weights = kept
        # share
        x, y = a.x, a.y
        for p, w in weights.items():
            edge = a.out.get(p)
            if edge is None:
                edge = a.out[p] = _Edge(a, self.agents[p], ids[p], self.dim)
            edge.sigma_x += x * w
            edge.sigma_y += w * y
        x *= self_w
        a.y = y * self_w
        sending = []
        for p, edge in a.out.items():
            if edge.inflight:
                continue
            if not flushes(p in weights, edge.sigma_y):
                continue
            decoded = edge.sigma_x.copy()
            edge.sent = None
            if numbered(edge.seq, edge.acked):
                edge.seq += 1
                edge.sent = (edge.seq, decoded, edge.sigma_y)
            sending.append((edge, decoded, edge.sigma_y, edge.seq, edge.base))
        for edge, *_ in sending:
            edge.inflight = True
        a.inflight += len(sending)
        now, size = loop.now, self.sizes.message
        messages = []
        for edge, _, _, seq, base in sending:
            index = edge.count
            edge.count = index + 1
            messages.append((edge.dst, index, size(i, edge.dst, round_index, seq, base, a.epoch)))
        verdicts = self._verdicts(a, messages, round_index)
        for (edge, decoded, sigma_y, seq, base), (_, _, nbytes), (drop, delay) in zip(
            sending, messages, verdicts, strict=True
        ):
            if drop:
                loop.at(now + delay, self._dropped, edge, nbytes)
            else:
                loop.at(now + delay, self._deliver, edge, round_index, seq, base, decoded,
                        sigma_y, nbytes)  # fmt: skip
        timeout = self.timeouts[i]
        if timeout <= 0:
            self._finish_round(a, round_index)
            return
        self.waiting[i] = round_index
        loop.at(now + timeout, self._timeout, a, round_index)
        self._check(a)

    def _verdicts(
        self, a: _Agent, messages: list[tuple[int, int, int]], round_index: int
    ) -> list[tuple[bool, float]]:
        """The link shaper's ``(drop, delay_s)`` of each message of a push, asked in order
        (a wireless shaper takes them at once)."""
        shaper = self.shaper
        if isinstance(shaper, WirelessLinkShaper):
            return shaper.plan_push(a.index, messages, round_index)
        if shaper is None:
            return [(False, 0.0)] * len(messages)
        verdicts = []
        for j, index, nbytes in messages:
            verdict = shaper.plan(a.agent_id, self.ids[j], round_index, index, nbytes)
            verdicts.append((verdict.drop, verdict.delay_s))
        return verdicts

    @staticmethod
    def _settle(edge: _Edge, nbytes: int, outcome: int) -> None:
        """A message on ``edge`` ended without delivery: counted as sent, and as
        ``outcome`` (2: dropped, 3: failed, the sender's counter columns)."""
        edge.inflight = False
        edge.sender.inflight -= 1
        c = edge.sender.counters
        c[0] += nbytes
        c[1] += 1
        c[outcome] += 1

    def _dropped(self, edge: _Edge, nbytes: int) -> None:
        self._settle(edge, nbytes, 2)
        self._check(edge.sender)

    def _deliver(self, edge: _Edge, round_index: int, seq: int, base: int,
                 vector: np.ndarray, y: float, nbytes: int) -> None:  # fmt: skip
        sender, receiver = edge.sender, edge.receiver
        i = sender.index
        heard = i in receiver.hears
        if not heard:
            left = receiver.former.get(i)
            heard = left is not None and receiver.round - left <= FORMER_ROUNDS
        if not heard or not (0 < y < math.inf):  # not an in-neighbour; a weight refused
            receiver.counters[5] += 1
            self._refused(sender, edge, nbytes)
            return
        # PushSum.receive, on the receiver's view of the edge
        held = edge.rho_x is not None
        last, held_base = (edge.last_seq, edge.in_base) if held else (0, 0)
        ack_last = last
        where = placement(sender.agent_id, seq, base, held=held, last_seq=last,
                          held_base=held_base)  # fmt: skip
        if where is not Placement.STALE:
            # Whether the message is taken depends on the weights alone: the vector is
            # updated in place only then, with the agent's operations in its order.
            pending_y = pending_weight(receiver.pending_y, y, edge.rho_y, where)
            if absorbs(pending_y, receiver.pending_y):
                receiver.pending_x += vector
                if where is Placement.REPLACES and edge.rho_x is not None:
                    receiver.pending_x -= edge.rho_x
                receiver.pending_y = pending_y
                edge.rho_x, edge.rho_y = vector, y
                edge.last_seq, edge.in_base = seq, base
                ack_last = seq
        receiver.counters[4] += 1
        if round_index > receiver.heard.get(i, 0):
            receiver.heard[i] = round_index
        # the sender takes the acknowledgement (PushSum.on_ack)
        edge.inflight = False
        sender.inflight -= 1
        c = sender.counters
        c[0] += nbytes
        c[1] += 1
        edge.acked = max(edge.acked, ack_last)
        sent = edge.sent
        if sent is not None and sent[0] == ack_last:
            edge.sent = None
            if rebases(ack_last, edge.base):  # measure from what the receiver now holds
                edge.sigma_x -= sent[1]
                edge.sigma_y -= sent[2]
                edge.base = ack_last
        sender.refusing.discard(edge.dst)
        # (_check returns at once for an agent with messages in flight: most calls here)
        if not sender.inflight:
            self._check(sender)
        if not receiver.inflight:
            self._check(receiver)

    def _refused(self, sender: _Agent, edge: _Edge, nbytes: int) -> None:
        self._settle(edge, nbytes, 3)
        sender.refusing.add(edge.dst)
        self._check(sender)
        self._check(edge.receiver)

    def _check(self, a: _Agent) -> None:
        round_index = self.waiting.get(a.index)
        if round_index is None or a.inflight:
            return
        last = round_index >= self.rounds
        need = round_index - (0 if last else self.staleness)
        heard = a.heard
        at_own_pace = self.asynchronous and not last  # its own sends only
        if not at_own_pace and not wait_over((heard.get(p, 0) for p in a.incoming), need):
            return
        self._finish_round(a, round_index)

    def _timeout(self, a: _Agent, round_index: int) -> None:
        if self.waiting.get(a.index) == round_index:
            self._finish_round(a, round_index)

    def _finish_round(self, a: _Agent, round_index: int) -> None:
        i = a.index
        self.waiting.pop(i, None)
        a.x += a.pending_x
        a.y += a.pending_y
        a.pending_x[:] = 0.0
        a.pending_y = 0.0
        record = self.report(a, round_index) if self.reports(round_index) else None
        if round_index < self.rounds:
            self.loop.at(self.loop.now, self._start_round, a, round_index + 1)
        self.round_done(round_index, record)

    def report(self, a: _Agent, round_index: int) -> RoundRecord:
        bytes_sent, sent, dropped, failed, received, rejected = a.counters
        counters = Counters(bytes_sent, sent, dropped, failed, received, rejected)
        estimate = a.x / a.y
        record = RoundRecord(
            agent_id=a.agent_id, round=round_index, wall_s=self.loop.now, metrics={},
            scalars={"weight": a.y}, final=round_index == self.rounds,
            estimate=probe_estimate(estimate, self.seed), counters=counters,
        )  # fmt: skip
        if self.sink is not None:
            self.sink.record(record)
        return record
