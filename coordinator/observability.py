"""The coordinator's Prometheus metrics, HTTP service discovery and fleet inspection.

All of the coordinator's Prometheus objects are created here. The fleet figures are a mirror of
state held elsewhere (the latest heartbeat of each agent, the current graph), so they are produced
at scrape time by a custom collector from one :class:`~airgossip.coordinator.views.FleetView`: an
agent that dies or leaves simply disappears from the next scrape, with no stale series.

Routes served next to ``/metrics``:

* ``/sd``: Prometheus HTTP service discovery, one target group per live or finished agent
  that exposes metrics, labelled ``agent=<id>`` (a finished agent still serves its final
  state while it lingers, or until it is stopped: ``--serve-until-stopped``);
* ``/fleet``: the fleet as JSON (members, states, epoch, graph), for operators and tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from airgossip.common.http import HttpSecurity, MetricsServer, json_route
from airgossip.coordinator.views import ALIVE, DEAD, FINISHED, LEFT, FleetView, TargetGroup

#: Per-agent gauges from heartbeats: (metric name, help, AgentSnapshot attribute).
AGENT_GAUGES = (
    ("airgossip_fleet_agent_round", "Latest round reported by each agent.", "round"),
    ("airgossip_fleet_agent_accuracy_ratio", "Test accuracy reported by each agent.", "accuracy"),
    ("airgossip_fleet_agent_loss", "Test loss reported by each agent.", "loss"),
    (
        "airgossip_fleet_agent_push_sum_weight",
        "Push-sum weight y of each agent.",
        "push_sum_weight",
    ),
    (
        "airgossip_fleet_agent_disagreement_ratio",
        "Relative change of each agent's estimate through its last mix (0 at consensus).",
        "disagreement",
    ),
)
#: Per-agent counters from heartbeats (cumulative since the agent started): (metric name,
#: help, field of :class:`~airgossip.edge.observability.stats.Counters`).
AGENT_COUNTERS = (
    ("airgossip_fleet_agent_sent_bytes", "Bytes each agent pushed.", "bytes_sent"),
    ("airgossip_fleet_agent_messages_sent", "Messages each agent pushed.", "messages_sent"),
    (
        "airgossip_fleet_agent_messages_received",
        "Messages each agent accepted.",
        "messages_received",
    ),
    (
        "airgossip_fleet_agent_messages_rejected",
        "Incoming messages each agent refused.",
        "messages_rejected",
    ),
)
#: Per directed link counters from heartbeats: (metric name, help, LinkTotals attribute).
LINK_COUNTERS = (
    ("airgossip_fleet_link_sent_bytes", "Bytes pushed along each directed link.", "bytes_sent"),
    (
        "airgossip_fleet_link_messages_sent",
        "Messages pushed along each directed link.",
        "messages_sent",
    ),
    (
        "airgossip_fleet_link_messages_dropped",
        "Messages lost on each directed (emulated) link.",
        "messages_dropped",
    ),
    (
        "airgossip_fleet_link_messages_failed",
        "Messages along each directed link refused by the receiver or failed in transport.",
        "messages_failed",
    ),
)
#: Coordinator event counters: (metric name, help, key of FleetView.counters).
EVENT_COUNTERS = (
    ("airgossip_coordinator_registrations", "Register calls accepted.", "registrations"),
    ("airgossip_coordinator_heartbeats", "Heartbeats accepted.", "heartbeats"),
    (
        "airgossip_coordinator_agent_failures",
        "Agents declared dead after missing their heartbeats.",
        "failures",
    ),
    ("airgossip_coordinator_agent_departures", "Agents that left the fleet.", "departures"),
)


#: Refused calls so far, by (method, reason).
RefusalSnapshot = Callable[[], dict[tuple[str, str], int]]


class FleetCollector(Collector):
    """Produces the fleet metrics from a fresh :class:`FleetView` at every scrape."""

    def __init__(
        self, view: Callable[[], FleetView], refusals: RefusalSnapshot | None = None
    ) -> None:
        self._view = view
        self._refusals = refusals

    def collect(self) -> Iterator[Metric]:
        if self._refusals is not None:
            refused = CounterMetricFamily(
                "airgossip_coordinator_refusals",
                "Calls refused, by method and reason.",
                labels=["method", "reason"],
            )
            for (method, reason), count in sorted(self._refusals().items()):
                refused.add_metric([method, reason], float(count))
            yield refused
        view = self._view()
        states = {ALIVE: 0, DEAD: 0, LEFT: 0, FINISHED: 0}
        for member in view.members:
            states[member.state] = states.get(member.state, 0) + 1
        alive = GaugeMetricFamily("airgossip_fleet_agents_alive", "Agents alive (heartbeating).")
        alive.add_metric([], states[ALIVE])
        yield alive
        by_state = GaugeMetricFamily(
            "airgossip_fleet_agents", "Registered agents by state.", labels=["state"]
        )
        for state, count in sorted(states.items()):
            by_state.add_metric([state], count)
        yield by_state
        expected = GaugeMetricFamily(
            "airgossip_fleet_agents_expected", "Agents the first graph waited for."
        )
        expected.add_metric([], view.expected)
        yield expected
        epoch = GaugeMetricFamily(
            "airgossip_fleet_topology_epoch", "Epoch of the current graph (bumps on every change)."
        )
        epoch.add_metric([], view.epoch)
        yield epoch
        connected = GaugeMetricFamily(
            "airgossip_fleet_graph_strongly_connected",
            "1 when every live agent's updates can reach every other live agent.",
        )
        connected.add_metric([], 1.0 if view.strongly_connected else 0.0)
        yield connected
        edges = GaugeMetricFamily(
            "airgossip_fleet_graph_edges", "Directed edges of the current graph (all phases)."
        )
        edges.add_metric([], sum(len(phase) for phase in view.edges))
        yield edges
        if not math.isnan(view.lambda2):
            lambda2 = GaugeMetricFamily(
                "airgossip_fleet_mixing_second_largest_eigenvalue",
                "Second-largest |eigenvalue| of the mixing matrix over one period (smaller "
                "mixes faster).",
            )
            lambda2.add_metric([], view.lambda2)
            yield lambda2

        live = [m for m in view.alive if m.stats is not None]
        age = GaugeMetricFamily(
            "airgossip_fleet_agent_heartbeat_age_seconds",
            "Seconds since each live agent's last heartbeat.",
            labels=["agent"],
        )
        for member in view.alive:
            if member.heartbeat_age_s is not None:
                age.add_metric([member.agent_id], member.heartbeat_age_s)
        yield age
        lag = GaugeMetricFamily(
            "airgossip_fleet_agent_assignment_epoch",
            "Epoch of the assignment each live agent says it uses.",
            labels=["agent"],
        )
        for member in view.alive:
            lag.add_metric([member.agent_id], member.assignment_epoch)
        yield lag
        for name, text, attribute in AGENT_GAUGES:
            gauge = GaugeMetricFamily(name, text, labels=["agent"])
            for member in live:
                value = getattr(member.stats, attribute)
                if value is not None:
                    gauge.add_metric([member.agent_id], float(value))
            yield gauge
        for name, text, attribute in AGENT_COUNTERS:
            counter = CounterMetricFamily(name, text, labels=["agent"])
            for member in live:
                assert member.stats is not None
                counts = member.stats.counters
                counter.add_metric([member.agent_id], float(getattr(counts, attribute)))
            yield counter
        for name, text, attribute in LINK_COUNTERS:
            counter = CounterMetricFamily(name, text, labels=["agent", "peer"])
            for member in live:
                assert member.stats is not None
                for peer, totals in sorted(member.stats.links.items()):
                    counter.add_metric([member.agent_id, peer], float(getattr(totals, attribute)))
            yield counter
        for name, text, key in EVENT_COUNTERS:
            counter = CounterMetricFamily(name, text)
            counter.add_metric([], float(view.counters.get(key, 0)))
            yield counter
        stalled = CounterMetricFamily(
            "airgossip_coordinator_stalled_seconds",
            "Time the coordinator itself did not run (its liveness sweep woke late); the "
            "agents' silence over it is not counted.",
        )
        stalled.add_metric([], view.counters.get("stalled_ms", 0) / 1000)
        yield stalled


def service_discovery(view: FleetView) -> list[TargetGroup]:
    """Prometheus HTTP SD target groups: one per live or finished agent with a metrics
    address (dead and departed agents serve nothing)."""
    return [
        {"targets": [m.metrics_address], "labels": {"agent": m.agent_id}}
        for m in view.members
        if m.state in (ALIVE, FINISHED) and m.metrics_address
    ]


def metrics_server(
    view: Callable[[], FleetView],
    listen: str,
    *,
    refusals: RefusalSnapshot | None = None,
    security: HttpSecurity | None = None,
) -> MetricsServer:
    """The coordinator's HTTP server: ``/metrics``, ``/sd`` and ``/fleet`` (and the count of
    refused calls from ``refusals``), behind ``security`` (TLS, basic auth) when given.

    Raises
    ------
    OSError
        With a one-line reason when ``listen`` cannot be bound.
    """
    registry = CollectorRegistry()
    registry.register(FleetCollector(view, refusals))
    return MetricsServer(
        registry,
        listen,
        routes={
            "/sd": json_route(lambda: service_discovery(view())),
            "/fleet": json_route(lambda: view().to_json()),
        },
        security=security,
    )
