"""An agent's Prometheus metrics (the HTTP server that exposes them is
:mod:`airgossip.common.http`).

Every Prometheus object of an agent process is created in :class:`AgentMetrics`, fed by the plain
records and events of :mod:`airgossip.edge.observability.stats` and
:mod:`airgossip.edge.observability.telemetry`; nothing else in ``edge`` touches
``prometheus_client`` (but the HTTP server, which serves a registry). To export more figures
(per-link radio state from an emulator, say), declare the new gauges in ``AgentMetrics.__init__``
and add one method that takes a plain record of them.

Names follow Prometheus conventions: base units in the name (``_seconds``, ``_bytes``,
``_ratio``), ``_total`` on counters, no ``*_created`` series. Series carry no agent label:
the scraper adds one (the coordinator's service discovery labels every target with
``agent``).
"""

from __future__ import annotations

import contextlib
import threading

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary

from airgossip.edge.observability.stats import RoundRecord
from airgossip.edge.observability.telemetry import (
    LinkFigures,
    LinkPackets,
    ReceiveEvent,
    SendEvent,
    StepEvent,
)
from airgossip.edge.privacy.figures import EPSILON, EXHAUSTED, STEPS
from airgossip.edge.transport.base import RejectCode

# `*_created` series double every counter and histogram for a timestamp nobody queries.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

#: Push latencies on loopback are ~1 ms; over a slow emulated link they reach seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: Local steps range from ~1 ms (consensus) to seconds (a real model on a CPU board).
STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: Message sizes from a few hundred bytes (probes) to hundreds of MB (large models).
SIZE_BUCKETS = tuple(float(4**k * 256) for k in range(12))


class AgentMetrics:
    """Prometheus view of one agent: a :class:`~airgossip.edge.observability.stats.StatsSink` and an
    :class:`~airgossip.edge.observability.telemetry.AgentObserver`.

    Parameters
    ----------
    agent_id:
        Exported as the ``agent_id`` label of ``airgossip_agent_info``.
    registry:
        Where the metrics live; a fresh :class:`CollectorRegistry` by default, so several
        agents (or tests) in one process never share series.
    """

    def __init__(self, agent_id: str, *, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.info = Gauge(
            "airgossip_agent_info", "Always 1; labels describe the agent.", ["agent_id"],
            registry=r,
        )  # fmt: skip
        self.round = Gauge("airgossip_agent_round", "Latest round the agent reported.", registry=r)
        self.rounds = Counter(
            "airgossip_agent_rounds", "Rounds this agent process completed (rate: rounds/s).",
            registry=r,
        )  # fmt: skip
        self.accuracy = Gauge(
            "airgossip_agent_accuracy_ratio", "Test accuracy of the agent's estimate.", registry=r
        )
        self.loss = Gauge("airgossip_agent_loss", "Test loss of the agent's estimate.", registry=r)
        self.weight = Gauge(
            "airgossip_agent_push_sum_weight", "Push-sum weight y held by the agent.", registry=r
        )
        self.disagreement = Gauge(
            "airgossip_agent_disagreement_ratio",
            "Relative change of the estimate through the last mix (0 at consensus).",
            registry=r,
        )
        self.energy = Gauge(
            "airgossip_agent_energy_joules",
            "Energy the agent has spent since its start, by kind (compute, radio), at its "
            "device class's power (airgossip.edge.energy); only agents whose class draws power.",
            ["kind"], registry=r,
        )  # fmt: skip
        #: Registered with the first battery figure: an agent without a battery exports none
        #: (an unlabelled gauge would read 0 from the start).
        self.battery_left: Gauge | None = None
        self.sent_bytes = Counter(
            "airgossip_agent_sent_bytes",
            "Bytes pushed to each out-neighbour (on the wire; lost messages included).",
            ["peer"],
            registry=r,
        )
        self.sent = Counter(
            "airgossip_agent_messages_sent", "Messages pushed to each out-neighbour.", ["peer"],
            registry=r,
        )  # fmt: skip
        self.dropped = Counter(
            "airgossip_agent_messages_dropped",
            "Messages to each out-neighbour lost on the (emulated) link.",
            ["peer"],
            registry=r,
        )
        self.failed = Counter(
            "airgossip_agent_messages_failed",
            "Messages to each out-neighbour refused by it or failed in transport, by gRPC code.",
            ["peer", "code"],
            registry=r,
        )
        self.received = Counter(
            "airgossip_agent_messages_received",
            "Messages accepted from each in-neighbour.",
            ["peer"],
            registry=r,
        )
        self.received_bytes = Counter(
            "airgossip_agent_received_bytes",
            "Payload bytes accepted from each in-neighbour.",
            ["peer"],
            registry=r,
        )
        self.rejected = Counter(
            "airgossip_agent_messages_rejected",
            "Incoming messages refused, by gRPC code and reason.",
            ["code", "reason"],
            registry=r,
        )
        for code in RejectCode:  # every code exported from the start, at 0 (its default reason)
            self.rejected.labels(code.value, code.value.lower())
        # What each current in-neighbour's messages do to this agent
        # (airgossip.edge.agent.influence): series of a peer that stops being an in-neighbour are
        # removed.
        self.in_absorbed = Counter(
            "airgossip_agent_in_neighbour_absorbed",
            "Messages of each in-neighbour that moved this agent's state.",
            ["peer"], registry=r,
        )  # fmt: skip
        self.in_increment = Summary(
            "airgossip_agent_in_neighbour_increment_ratio",
            "Relative increment of each absorbed message of an in-neighbour: distance of the "
            "value it proposes from the agent's estimate, over the estimate's norm "
            "(rate of _sum over rate of _count: the mean).",
            ["peer"], registry=r,
        )  # fmt: skip
        self.in_onset = Gauge(
            "airgossip_agent_in_neighbour_outlier_onset_seconds",
            "When this agent began to find each in-neighbour's messages outliers (over ten "
            "times its other in-neighbours' typical relative increment and over half its own "
            "norm), in seconds since the epoch by its clock; present only while it does, and "
            "for a minute after (airgossip.edge.agent.influence.OutlierOnsets).",
            ["peer"], registry=r,
        )  # fmt: skip
        self.in_refused = Counter(
            "airgossip_agent_in_neighbour_refused",
            "Messages of each in-neighbour refused, by reason.",
            ["peer", "reason"], registry=r,
        )  # fmt: skip
        self.in_clipped = Counter(
            "airgossip_agent_in_neighbour_clipped",
            "Messages of each in-neighbour the robust algorithm clipped.",
            ["peer"], registry=r,
        )  # fmt: skip
        self.in_drift = Gauge(
            "airgossip_agent_in_neighbour_drift_score",
            "How persistently each in-neighbour's offers pull this agent one way: the norm of "
            "their mean displacement over about 20 rounds, in multiples of the other "
            "in-neighbours' typical displacement (airgossip.edge.algorithms.drift): at most "
            "about 3 for honest in-neighbours, tens for a slow drifter.",
            ["peer"], registry=r,
        )  # fmt: skip
        self._in_series: dict[str, set[tuple[str, ...]]] = {}  # peer -> its refusal labels
        self._in_lock = threading.Lock()  # events come from the transport's threads
        self.push_latency = Histogram(
            "airgossip_agent_push_latency_seconds",
            "Time from handing a message to the transport to the peer's acknowledgement.",
            ["peer"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.push_size = Histogram(
            "airgossip_agent_push_size_bytes",
            "Wire size of each pushed message.",
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.local_step = Histogram(
            "airgossip_agent_local_step_seconds",
            "Duration of each local optimisation step.",
            buckets=STEP_BUCKETS,
            registry=r,
        )
        # Radio state of each out-link, when a link emulator feeds it (see observe_links).
        self.link_in_range = Gauge(
            "airgossip_link_in_range", "1 while the emulated radio link to peer exists.",
            ["peer"], registry=r,
        )  # fmt: skip
        self.link_sinr = Gauge(
            "airgossip_link_sinr_decibels", "Emulated SINR of the link to peer, dB.", ["peer"],
            registry=r,
        )  # fmt: skip
        # In bytes/s, the base unit (promtool refuses "bits"): the PHY's bit rate over 8.
        self.link_rate = Gauge(
            "airgossip_link_rate_bytes_per_second",
            "Emulated physical rate of the link to peer (its bit rate / 8).",
            ["peer"], registry=r,
        )  # fmt: skip
        self.link_error = Gauge(
            "airgossip_link_packet_error_ratio",
            "Emulated packet error probability of one attempt on the link to peer.",
            ["peer"], registry=r,
        )  # fmt: skip
        self.link_burst = Gauge(
            "airgossip_link_burst_bad",
            "1 while the link to peer is in the bad state of its bursty-loss chain.",
            ["peer"], registry=r,
        )  # fmt: skip
        # Packets of each in-link at the agent's interface, when a kernel link emulator
        # shapes it (see observe_link_packets); ``peer`` is the sender.
        self.link_arrived = Counter(
            "airgossip_link_arrived_packets",
            "Packets from peer that reached this agent's interface (kernel link emulation; "
            "dropped ones included).",
            ["peer"], registry=r,
        )  # fmt: skip
        self.link_dropped = Counter(
            "airgossip_link_dropped_packets",
            "Packets from peer dropped by the emulated link at this agent's interface.",
            ["peer"], registry=r,
        )  # fmt: skip
        # Differential privacy of the agent's training data ([privacy]).
        self.privacy_epsilon = Gauge(
            "airgossip_agent_privacy_epsilon",
            "Epsilon the agent has spent on its training data so far, at the run's delta "
            "(+Inf without a privacy mechanism: no guarantee).",
            registry=r,
        )
        self.privacy_epsilon.set(float("inf"))
        self.privacy_exhausted = Gauge(
            "airgossip_agent_privacy_budget_exhausted",
            "1 once the privacy budget stopped the agent's training.",
            registry=r,
        )
        self._packets: dict[str, tuple[int, int]] = {}
        self._last_round = 0
        self.info.labels(agent_id).set(1)

    # -- StatsSink --------------------------------------------------------------------------
    def record(self, record: RoundRecord) -> None:
        self.rounds.inc(max(0, record.round - self._last_round))
        self._last_round = max(self._last_round, record.round)
        self.round.set(record.round)
        if "accuracy" in record.metrics:
            self.accuracy.set(record.metrics["accuracy"])
        if "loss" in record.metrics:
            self.loss.set(record.metrics["loss"])
        if "weight" in record.scalars:
            self.weight.set(record.scalars["weight"])
        if "disagreement" in record.scalars:
            self.disagreement.set(record.scalars["disagreement"])
        if "energy_j" in record.metrics:
            self.energy.labels("compute").set(record.metrics.get("compute_j", 0.0))
            self.energy.labels("radio").set(record.metrics.get("radio_j", 0.0))
        if "battery_left_j" in record.metrics:
            if self.battery_left is None:
                self.battery_left = Gauge(
                    "airgossip_agent_battery_left_joules",
                    "Energy left in the agent's battery (agents whose device class has one).",
                    registry=self.registry,
                )
            self.battery_left.set(record.metrics["battery_left_j"])
        if STEPS in record.metrics:  # a privacy mechanism's figures (no epsilon: unbounded)
            self.privacy_epsilon.set(record.metrics.get(EPSILON, float("inf")))
            self.privacy_exhausted.set(record.metrics.get(EXHAUSTED, 0.0))

    def observe_links(self, links: list[LinkFigures]) -> None:
        """Set the radio gauges of each out-link from an emulator's plain figures."""
        for link in links:
            self.link_in_range.labels(link.peer).set(1.0 if link.in_range else 0.0)
            self.link_sinr.labels(link.peer).set(link.sinr_db)
            self.link_rate.labels(link.peer).set(link.rate_bps / 8)
            self.link_error.labels(link.peer).set(link.error_ratio)
            self.link_burst.labels(link.peer).set(1.0 if link.burst_bad else 0.0)

    def observe_link_packets(self, links: list[LinkPackets]) -> None:
        """Advance the in-link packet counters to a kernel emulator's cumulative counts."""
        for link in links:
            arrived, dropped = self._packets.get(link.peer, (0, 0))
            # Counts that went backwards (rules rewritten without their counters) restart.
            self.link_arrived.labels(link.peer).inc(max(0, link.arrived - arrived))
            self.link_dropped.labels(link.peer).inc(max(0, link.dropped - dropped))
            self._packets[link.peer] = (link.arrived, link.dropped)

    # -- AgentObserver ----------------------------------------------------------------------
    def on_send(self, event: SendEvent) -> None:
        self.sent_bytes.labels(event.peer).inc(event.wire_bytes)
        self.sent.labels(event.peer).inc()
        self.push_size.observe(event.wire_bytes)
        if event.outcome == "delivered":
            self.push_latency.labels(event.peer).observe(event.seconds)
        elif event.outcome == "dropped":
            self.dropped.labels(event.peer).inc()
        else:
            self.failed.labels(event.peer, event.code or "UNKNOWN").inc()

    def on_step(self, event: StepEvent) -> None:
        self.local_step.observe(event.seconds)

    def on_receive(self, event: ReceiveEvent) -> None:
        peer = event.sender
        with self._in_lock:
            self._count_receive(event, peer)

    def _count_receive(self, event: ReceiveEvent, peer: str) -> None:
        if event.accepted:
            self.received.labels(peer).inc()
            self.received_bytes.labels(peer).inc(event.payload_bytes)
            if event.increment is not None:
                self._in_series.setdefault(peer, set())
                self.in_absorbed.labels(peer).inc()
                self.in_increment.labels(peer).observe(event.increment)
            if event.onset:
                self.in_onset.labels(peer).set(event.onset)
            elif event.onset is not None:
                with contextlib.suppress(KeyError):
                    self.in_onset.remove(peer)
            if event.clipped:
                self._in_series.setdefault(peer, set())
                self.in_clipped.labels(peer).inc(event.clipped)
            if event.drift is not None:
                self._in_series.setdefault(peer, set())
                self.in_drift.labels(peer).set(event.drift)
        else:
            code = event.code or "UNKNOWN"
            reason = event.reason or code.lower()
            self.rejected.labels(code, reason).inc()
            if peer:  # charged to a current in-neighbour
                self._in_series.setdefault(peer, set()).add((peer, reason))
                self.in_refused.labels(peer, reason).inc()

    def on_in_neighbours(self, peers: frozenset[str]) -> None:
        """Forget the per-in-neighbour series of peers that are no longer in-neighbours."""
        with self._in_lock:
            self._forget(peers)

    def _forget(self, peers: frozenset[str]) -> None:
        for peer in [p for p in self._in_series if p not in peers]:
            for labels in self._in_series.pop(peer):
                self.in_refused.remove(*labels)
            metrics = (self.in_absorbed, self.in_increment, self.in_onset, self.in_clipped)
            for metric in (*metrics, self.in_drift):
                with contextlib.suppress(KeyError):
                    metric.remove(peer)
