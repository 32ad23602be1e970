"""Plain events an agent emits while it works, and a keeper of its latest figures.

The agent knows nothing of Prometheus or of the coordinator. Besides the per-round
:class:`~airgossip.edge.observability.stats.RoundRecord` it hands an :class:`AgentObserver` three
kinds of event, measured where they happen:

* :class:`SendEvent`: one push finished (delivered, dropped by the link, or failed), with its
  wire size and how long it took;
* :class:`StepEvent`: one local optimisation step and its duration;
* :class:`ReceiveEvent`: one incoming message accepted or refused (and why).

Consumers (the Prometheus exporter in :mod:`airgossip.edge.observability.metrics`,
:class:`LatestStats` for the coordinator's heartbeats) implement whichever methods they need;
:class:`Telemetry` fans records and events out to all of them.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from airgossip.edge.observability.stats import Counters, RoundRecord


@dataclass(frozen=True)
class SendEvent:
    """One push to one out-neighbour, finished.

    Attributes
    ----------
    peer:
        The out-neighbour.
    round:
        The sender's round when the push started.
    wire_bytes:
        Bytes the message occupies on the wire (counted for drops too).
    seconds:
        From handing the message to the transport to its outcome.
    outcome:
        ``"delivered"``, ``"dropped"`` (lost on the emulated link) or ``"failed"``
        (refused by the peer, or a transport error).
    code:
        For ``failed``: the gRPC status name; empty otherwise.
    """

    peer: str
    round: int
    wire_bytes: int
    seconds: float
    outcome: str
    code: str = ""


@dataclass(frozen=True)
class LinkFigures:
    """The radio state of one out-link, from a link emulator (plain data).

    Attributes
    ----------
    peer:
        The receiver of the directed link.
    in_range:
        Whether the link exists now (received power at least the lowest rate's sensitivity).
    sinr_db:
        Signal to interference and noise ratio, dB.
    rate_bps:
        Physical rate the link would use now, bit/s.
    error_ratio:
        Packet error probability of one attempt.
    burst_bad:
        Whether the link is in the bad state of its bursty-loss chain.
    """

    peer: str
    in_range: bool
    sinr_db: float
    rate_bps: float
    error_ratio: float
    burst_bad: bool


@dataclass(frozen=True)
class LinkPackets:
    """Packets of one in-link at this agent's interface, from a kernel link emulator
    (cumulative counts since the emulation started; plain data).

    Attributes
    ----------
    peer:
        The sender of the directed link.
    arrived:
        Packets from ``peer`` that reached the interface (those dropped included).
    dropped:
        Packets from ``peer`` the emulated link dropped.
    """

    peer: str
    arrived: int
    dropped: int


@dataclass(frozen=True)
class StepEvent:
    """One local optimisation step (``task.train`` plus folding its update into the state)."""

    round: int
    seconds: float


@dataclass(frozen=True)
class ReceiveEvent:
    """One incoming message, accepted or refused.

    ``sender`` of a refusal is empty unless it is a current in-neighbour (whose identity the
    transport checked): what a refused message claims must not create series at will.
    """

    accepted: bool
    sender: str = ""
    code: str = ""
    payload_bytes: int = 0
    #: For refusals: a short fixed label of why (``wrong_receiver``, ``weight``...).
    reason: str = ""
    #: For an absorbed message of a current in-neighbour: how far it moved the receiver
    #: (:mod:`airgossip.edge.agent.influence`); None otherwise.
    increment: float | None = None
    #: With ``increment``: when the sender's current run of outlier messages began, in seconds
    #: since the epoch by this agent's clock, 0.0 when it is in none
    #: (:class:`~airgossip.edge.agent.influence.OutlierOnsets`); None otherwise.
    onset: float | None = None
    #: Clip events of the sender's messages since its last event (algorithms that clip).
    clipped: int = 0
    #: The sender's drift score (:mod:`airgossip.edge.algorithms.drift`) on algorithms with a drift
    #: budget; None otherwise.
    drift: float | None = None


@runtime_checkable
class AgentObserver(Protocol):
    """Receives an agent's events; called from the agent's and the transport's threads."""

    def on_send(self, event: SendEvent) -> None: ...

    def on_step(self, event: StepEvent) -> None: ...

    def on_receive(self, event: ReceiveEvent) -> None: ...


class Telemetry:
    """Fans round records and events out to several consumers.

    Each consumer implements any of ``record`` (a
    :class:`~airgossip.edge.observability.stats.StatsSink`),
    ``on_send``, ``on_step`` and ``on_receive``; the missing ones are skipped.
    """

    def __init__(self, *consumers: object) -> None:
        self.consumers = [c for c in consumers if c is not None]

    def record(self, record: RoundRecord) -> None:
        for consumer in self.consumers:
            if hasattr(consumer, "record"):
                consumer.record(record)

    def on_send(self, event: SendEvent) -> None:
        for consumer in self.consumers:
            if hasattr(consumer, "on_send"):
                consumer.on_send(event)

    def on_step(self, event: StepEvent) -> None:
        for consumer in self.consumers:
            if hasattr(consumer, "on_step"):
                consumer.on_step(event)

    def on_receive(self, event: ReceiveEvent) -> None:
        for consumer in self.consumers:
            if hasattr(consumer, "on_receive"):
                consumer.on_receive(event)

    def on_in_neighbours(self, peers: frozenset[str]) -> None:
        for consumer in self.consumers:
            if hasattr(consumer, "on_in_neighbours"):
                consumer.on_in_neighbours(peers)


@dataclass
class LinkTotals:
    """What one agent has sent along one directed link since it started."""

    bytes_sent: int = 0
    messages_sent: int = 0
    messages_dropped: int = 0
    messages_failed: int = 0


@dataclass(frozen=True)
class AgentSnapshot:
    """An agent's latest figures, as reported in heartbeats (counters since start)."""

    round: int = 0
    accuracy: float | None = None
    loss: float | None = None
    counters: Counters = field(default_factory=Counters)
    push_sum_weight: float | None = None
    disagreement: float | None = None
    links: dict[str, LinkTotals] = field(default_factory=dict)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class LatestStats:
    """Keeps an agent's latest round record and per-link totals for its heartbeats."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._record: RoundRecord | None = None
        self._round = 0
        self._links: dict[str, LinkTotals] = {}

    def record(self, record: RoundRecord) -> None:
        with self._lock:
            self._record = record
            self._round = max(self._round, record.round)

    def on_step(self, event: StepEvent) -> None:
        with self._lock:
            self._round = max(self._round, event.round)

    def on_send(self, event: SendEvent) -> None:
        with self._lock:
            link = self._links.setdefault(event.peer, LinkTotals())
            link.bytes_sent += event.wire_bytes
            link.messages_sent += 1
            if event.outcome == "dropped":
                link.messages_dropped += 1
            elif event.outcome == "failed":
                link.messages_failed += 1

    def snapshot(self) -> AgentSnapshot:
        """The latest figures; links are copies, safe to keep."""
        with self._lock:
            r = self._record
            links = {p: LinkTotals(**vars(t)) for p, t in self._links.items()}
            if r is None:
                return AgentSnapshot(round=self._round, links=links)
            return AgentSnapshot(
                round=self._round,
                accuracy=_finite(r.metrics.get("accuracy")),
                loss=_finite(r.metrics.get("loss")),
                counters=r.counters.copy(),
                push_sum_weight=_finite(r.scalars.get("weight")),
                disagreement=_finite(r.scalars.get("disagreement")),
                links=links,
            )
