"""The wireless link shaper: the channel model's verdict on each message, and shared air.

:class:`WirelessLinkShaper` is the :class:`~airgossip.edge.transport.base.LinkShaper` every fleet
uses for a wireless network. It reads the time from a clock it is handed (wall clock since
the scenario's start, or a virtual clock) and turns the channel state into a verdict for one
message: how long it takes (access latency, jitter, then its bytes at the link's rate step
by step, so a rate change mid-transfer is honoured, split with concurrent transfers in the
same carrier-sense domain) and whether it is lost (decided per chunk at the step the chunk
starts).

Per-message draws come from a counter-based hash (:func:`airgossip.common.seeds.keyed_hash`) of
``(seed, sender, receiver, step, message index, purpose)``: no generator state, the same
verdict whichever thread or process asks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from airgossip.common.seeds import keyed_hash, splitmix64, to_unit
from airgossip.edge.transport.base import LinkVerdict
from airgossip.emulation.channel.model import AnyLinkState, ChannelBase
from airgossip.emulation.channel.state import chunk_loss_probability
from airgossip.scenario.wireless import WirelessSettings

_UNIT = NormalDist()
# Purposes of per-message draws (the last hash key).
_JITTER, _CHUNK = 1, 16


def _uniform(h: int, purpose: int) -> float:
    return to_unit(splitmix64(h ^ purpose))


class AirtimeLedger:
    """Airtime booked in each step by each node, so that transfers in one carrier-sense
    domain share the air.

    A transfer in step ``k`` progresses at ``rate * (1 - U / dt)``, where ``U`` is the
    airtime already booked in that step by the nodes its sender hears (itself included)
    whose transfers are still on the air; it then books the airtime it used. In a busy
    domain later transfers slow down or wait for the next step, and the airtime of a step
    is never handed out twice (a fluid version of CSMA's one-at-a-time that assumes the
    contenders' airtime is spread over the step).

    Not thread-safe: shapers that share one ledger must serialise their calls into it (a
    shaper holds its own lock around each verdict).
    """

    def __init__(self, n: int, keep_steps: int = 64) -> None:
        self.n = n
        self.keep_steps = keep_steps
        self._busy: dict[int, np.ndarray] = {}
        #: When each node's last booked transfer ends: finished transfers do not contend.
        self._until = np.full(n, -np.inf)
        # ``until > now`` for the latest ``now`` asked: the messages of one push all start at
        # the same time, and a booking moves one node's entry only (kept exact in ``book``).
        self._on_air_at: float | None = None
        self._on_air = np.zeros(n, dtype=bool)

    def utilisation(self, step: int, hears_row: np.ndarray, step_s: float, now: float) -> float:
        """Share of step ``step`` booked in a node's domain (``hears_row``: a boolean row, or
        the indices of the nodes heard) by transfers still on the air at ``now``."""
        busy = self._busy.get(step)
        if busy is None:
            return 0.0
        if hears_row.dtype != bool:
            # The indices of the nodes heard (the model over the links in range): only the
            # sender's carrier-sense domain is read, never an n-wide vector (each message
            # starts at a time of its own, so an n-wide mask would be redone per message),
            # and the airtime only of the nodes still on the air.
            on_air = hears_row[self._until.take(hears_row) > now]
            used = float(busy.take(on_air).sum())
            return min(1.0, used / step_s)
        if now != self._on_air_at:  # a row of the dense model's n x n (small fleets)
            np.greater(self._until, now, out=self._on_air)
            self._on_air_at = now
        used = float(np.dot(hears_row & self._on_air, busy))
        return min(1.0, used / step_s)

    def book(self, sender: int, step: int, airtime_s: float, until: float) -> None:
        busy = self._busy.get(step)
        if busy is None:
            busy = self._busy[step] = np.zeros(self.n, dtype=np.float64)
            for old in [s for s in self._busy if s < step - self.keep_steps]:
                del self._busy[old]
        busy[sender] += airtime_s
        if until > self._until[sender]:
            self._until[sender] = until
            if self._on_air_at is not None:
                self._on_air[sender] = until > self._on_air_at


#: A link's figures in one step, as Python values: its handle in the state, whether it
#: exists, latency (s), burst state, residual loss, goodput (b/s; 0 where it does not exist),
#: the link's hash keyed by the step (a message's draws hash it with the message index) and
#: the loss probability of a one-packet chunk (most messages).
_Figures = tuple[Any, bool, float, bool, float, float, int, float]
#: Steps before the latest message's start step that a shaper still keeps (their states and
#: link figures); every step from there on is kept. Messages start in time order, but a
#: transfer runs into the steps after its start (up to ``max_stall_s`` in a fade) while later
#: messages still start in the step before: a shaper that kept only the latest step it asked
#: for alternated between two, and a model that caches two steps replayed the whole run from
#: step 0 when an older one came back (at 10,000 agents, three replays of half a minute a step
#: before round 1 ended).
_KEEP_BEHIND = 1


class _StepLinks:
    """One step's link state and the figures of the links asked in it, read once each: a
    step holds many messages per link (lte-urban: about ten), and each would otherwise
    index the state's arrays five times. The values are the state's own, converted as the
    state's accessors convert them. ``seed``: the model's (a link's draws are keyed by it)."""

    __slots__ = ("figures", "hears", "packet_bytes", "seed", "state", "step")

    def __init__(self, state: AnyLinkState, step: int, seed: int, packet_bytes: int) -> None:
        # Over the links in range (large fleets) only what a verdict reads is held: a shaper
        # holds every step a transfer may still run into (up to ``max_stall_s`` ahead).
        self.state = state.for_verdicts()
        self.step, self.seed, self.packet_bytes = step, seed, packet_bytes
        self.figures: dict[int, _Figures] = {}
        #: Each sender's carrier-sense domain, as the state gives it (read once a sender).
        self.hears: dict[int, np.ndarray] = {}

    def link(self, i: int, j: int, pair: int) -> _Figures:
        """Link i->j's figures (``pair``: ``i * n + j``, the key they are kept by)."""
        figures = self.figures.get(pair)
        if figures is None:
            st = self.state
            handle = st.link(i, j)
            latency = st.latency(handle, i, j)
            step_hash = keyed_hash(self.seed, i, j, self.step)
            if st.has(handle):
                bad, residual = bool(st.bad[handle]), float(st.residual[handle])
                one_packet = chunk_loss_probability(True, bad, residual, 1, self.packet_bytes,
                                                    st.loss_good, st.loss_bad)  # fmt: skip
                figures = (handle, True, latency, bad, residual, float(st.goodput_bps[handle]),
                           step_hash, one_packet)  # fmt: skip
            else:
                figures = (handle, False, latency, False, 0.0, 0.0, step_hash, 1.0)
            self.figures[pair] = figures
        return figures

    def hears_of(self, i: int) -> np.ndarray:
        """The state's ``hears_of(i)``, kept."""
        row = self.hears.get(i)
        if row is None:
            row = self.hears[i] = self.state.hears_of(i)
        return row

    def chunk_loss(self, figures: _Figures, nbytes: int) -> float:
        """As the state's ``chunk_loss_at`` of the link."""
        if not figures[1]:
            return 1.0
        if nbytes <= self.packet_bytes:  # one packet: kept with the figures
            return figures[7]
        st = self.state
        return chunk_loss_probability(True, figures[3], figures[4], nbytes, self.packet_bytes,
                                      st.loss_good, st.loss_bad)  # fmt: skip


@dataclass
class LinkCounters:
    messages: int = 0
    bytes: int = 0
    drops: int = 0
    delay_s: float = 0.0


@dataclass(frozen=True)
class LinkRecord:
    """One directed link's figures (plain data): the channel, and what a shaper planned on it.

    ``sinr_db``, ``rate_bps``, ``error_rate`` (packet error of one attempt), ``bad`` (burst
    state) and ``exists`` are the channel at ``time_s``; ``messages``, ``bytes``, ``drops``
    and ``mean_delay_s`` count what this shaper planned on the link so far.
    """

    sender: str
    receiver: str
    time_s: float
    exists: bool
    sinr_db: float
    rate_bps: float
    goodput_bps: float
    error_rate: float
    bad: bool
    messages: int
    bytes: int
    drops: int
    mean_delay_s: float


@dataclass(frozen=True)
class PlannedMessage:
    """A verdict with what it was based on (the shaper's journal)."""

    sender: str
    receiver: str
    round: int
    index: int
    start_s: float
    nbytes: int
    drop: bool
    delay_s: float


class WirelessLinkShaper:
    """Link shaper driven by a channel model (dense or over the links in range).

    Parameters
    ----------
    model:
        The channel model (shared by every agent of this process).
    ids:
        Agent ids; node ``i`` of the model is ``ids[i]``.
    clock:
        Seconds since the scenario's t = 0 (wall or virtual).
    ledger:
        Shared-air bookkeeping; pass one ledger to every shaper that shares the air.
    journal:
        Keep every verdict in :attr:`journal` (replay logs, determinism tests).
    """

    def __init__(
        self,
        model: ChannelBase,
        ids: list[str],
        clock: Callable[[], float],
        *,
        ledger: AirtimeLedger | None = None,
        journal: bool = False,
    ) -> None:
        self.model = model
        self.settings: WirelessSettings = model.settings
        self.ids = list(ids)
        self.index_of = {agent_id: i for i, agent_id in enumerate(self.ids)}
        self.clock = clock
        self.ledger = ledger if ledger is not None else AirtimeLedger(model.n)
        self.counters: dict[tuple[int, int], LinkCounters] = {}
        self.journal: list[PlannedMessage] | None = [] if journal else None
        self._lock = threading.Lock()
        self._views: dict[int, _StepLinks] = {}
        self._start_step = 0  # the step of the latest message's start

    def plan(self, sender: str, receiver: str, round: int, index: int, nbytes: int) -> LinkVerdict:
        """Decide the fate of one message starting now on sender->receiver."""
        index_of = self.index_of
        i, j = index_of.get(sender), index_of.get(receiver)
        if i is None or j is None:
            return LinkVerdict(drop=True)
        drop, delay = self.plan_push(i, [(j, index, nbytes)], round)[0]
        return LinkVerdict(drop=drop, delay_s=delay)

    def plan_push(
        self, i: int, messages: list[tuple[int, int, int]], round: int
    ) -> list[tuple[bool, float]]:
        """The verdicts ``(drop, delay_s)`` of the messages node ``i`` starts now, each
        ``(receiver node, message index, bytes)``: what :meth:`plan` says of each asked in
        this order (the fleets on the virtual clock ask a push's messages at once)."""
        verdicts = []
        counters_of, journal = self.counters, self.journal
        with self._lock:
            start = self.clock()
            step = self._start_step = self.model.step_of(start)
            view = self._view(step)
            for j, index, nbytes in messages:
                drop, delay = self._plan(i, j, index, nbytes, start, step, view)
                counters = counters_of.get((i, j))
                if counters is None:
                    counters = counters_of[(i, j)] = LinkCounters()
                counters.messages += 1
                counters.bytes += nbytes
                if drop:
                    counters.drops += 1
                counters.delay_s += delay
                if journal is not None:
                    journal.append(PlannedMessage(self.ids[i], self.ids[j], round, index, start,
                                                  nbytes, drop, delay))  # fmt: skip
                verdicts.append((drop, delay))
        return verdicts

    def _plan(
        self, i: int, j: int, index: int, nbytes: int, start: float, step: int, view: _StepLinks
    ) -> tuple[bool, float]:
        """One message's verdict (``step``, ``view``: the step of ``start`` and its links)."""
        cfg, model = self.settings, self.model
        pair = i * model.n + j
        figures = view.link(i, j, pair)
        latency = figures[2]
        # keyed_hash(seed, i, j, step, index): its keys are non-negative and below 2**64
        message_hash = splitmix64(figures[6] ^ index)
        if cfg.jitter_ms > 0:
            u = _uniform(message_hash, _JITTER)
            u = min(max(u, 1e-12), 1.0 - 1e-12)
            latency = max(0.0, latency + cfg.jitter_ms / 1000.0 * _UNIT.inv_cdf(u))
        t = start + latency
        chunk = cfg.chunk_bytes
        # Most messages are one chunk (a model under chunk_bytes): no list of sizes.
        sizes = (
            (nbytes,)
            if 0 < nbytes <= chunk
            else [min(chunk, nbytes - off) for off in range(0, nbytes, chunk)] or [0]
        )
        for c, size in enumerate(sizes):
            chunk_step = model.step_of(t)
            if chunk_step == step:
                v, on, h = view, figures, message_hash
            else:
                v = self._view(chunk_step)
                on = v.link(i, j, pair)
                h = splitmix64(on[6] ^ index)
            loss = v.chunk_loss(on, size)
            if loss > 0 and _uniform(h, _CHUNK + c) < loss:
                # Lost: the sender spends the chunk's airtime (when the link carries
                # anything) and learns of the loss a retransmission timeout later.
                if on[1] and on[5] > 0:
                    t, _ = self._transfer(i, j, t, size, (chunk_step, v, on))
                return True, t - start + cfg.loss_timeout_ms / 1000.0
            t, broken = self._transfer(i, j, t, size, (chunk_step, v, on))
            if broken:
                return True, t - start + cfg.loss_timeout_ms / 1000.0
        return False, t - start

    def _view(self, step: int) -> _StepLinks:
        """The model's state of ``step`` with the figures of the links asked in it so far
        (kept from :data:`_KEEP_BEHIND` steps before the latest start on: most messages in
        a step ask for the same)."""
        view = self._views.get(step)
        if view is None:
            state = self.model.state(step)
            view = _StepLinks(state, step, self.model.seed, self.settings.packet_bytes)
            self._views[step] = view
            floor = self._start_step - _KEEP_BEHIND
            for old in [s for s in self._views if s < floor]:
                del self._views[old]
        return view

    def _transfer(
        self, i: int, j: int, t: float, nbytes: int, known: tuple[int, _StepLinks, _Figures]
    ) -> tuple[float, bool]:
        """Move ``nbytes`` over i->j from time ``t``, step by step at each step's rate and
        airtime share; return the end time and whether the transfer broke (the link went
        out of range, or it stalled in a fade for more than ``max_stall_s``). ``known`` is
        ``(step, its links, the link's figures in it)`` the caller already looked up."""
        model, dt, cfg = self.model, self.model.step_s, self.settings
        shared_air, ledger = cfg.shared_air, self.ledger
        remaining = nbytes * 8.0
        stall_from: float | None = None
        while remaining > 0:
            step = model.step_of(t)
            if step == known[0]:
                view, figures = known[1], known[2]
            else:
                view = self._view(step)
                figures = view.link(i, j, i * model.n + j)
            if not figures[1]:
                return t, True
            end = (step + 1) * dt
            rate = figures[5]
            free = 1.0
            if rate > 0 and shared_air:
                free = 1.0 - ledger.utilisation(step, view.hears_of(i), dt, t)
            if rate <= 0 or free <= 1e-6:
                stall_from = t if stall_from is None else stall_from
                if end - stall_from > cfg.max_stall_s:
                    return stall_from + cfg.max_stall_s, True
                t = end
                continue
            stall_from = None
            effective = rate * free
            span = min(remaining / effective, end - t)
            sent = effective * span
            remaining -= sent
            t += span
            if shared_air:
                ledger.book(i, step, sent / rate, t)
            if remaining <= 1e-6:
                break
            t = max(t, end)
        return t, False

    # -- figures -------------------------------------------------------------------------------
    def snapshot(
        self, time_s: float | None = None, *, active_only: bool = True
    ) -> list[LinkRecord]:
        """Per-link figures at ``time_s`` (default: now) for links that carried traffic
        (``active_only``) or that exist."""
        t = self.clock() if time_s is None else time_s
        state = self.model.at(t)
        with self._lock:
            counters = dict(self.counters)
        if active_only:
            pairs = sorted(counters)
        else:
            src, dst = state.link_pairs()
            pairs = sorted({*counters, *zip(src.tolist(), dst.tolist(), strict=True)})
        return [
            link_record(state, self.ids, int(i), int(j), counters.get((i, j))) for i, j in pairs
        ]


def link_record(
    state: AnyLinkState, ids: list[str], i: int, j: int, counters: LinkCounters | None = None
) -> LinkRecord:
    c = counters or LinkCounters()
    exists, sinr, rate, goodput, per, bad = state.figures(state.link(i, j))
    return LinkRecord(
        sender=ids[i], receiver=ids[j], time_s=state.time_s, exists=exists, sinr_db=sinr,
        rate_bps=rate, goodput_bps=goodput, error_rate=per, bad=bad, messages=c.messages,
        bytes=c.bytes, drops=c.drops, mean_delay_s=c.delay_s / c.messages if c.messages else 0.0,
    )  # fmt: skip
