"""Metrics: the agent's events where they happen, Prometheus conventions checked by promtool,
the coordinator's fleet gauges and its HTTP service discovery."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client import generate_latest

from airgossip.common.http import MetricsServer
from airgossip.common.topology import assignments_for_graph, build_graph
from airgossip.coordinator.membership import LivenessSettings, Membership
from airgossip.coordinator.observability import metrics_server, service_discovery
from airgossip.coordinator.policy import TopologySpec, make_policy
from airgossip.coordinator.store import FleetStore
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.observability.metrics import AgentMetrics
from airgossip.edge.observability.stats import Counters, MemoryStatsSink, RoundRecord
from airgossip.edge.observability.telemetry import (
    AgentSnapshot,
    LatestStats,
    LinkTotals,
    ReceiveEvent,
    SendEvent,
    StepEvent,
    Telemetry,
)
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.transport import InMemoryNetwork, InMemoryTransport, Rejected
from airgossip.edge.transport.base import MessageHeader
from tests.support.agents import FakeClock, Recorder
from tests.support.prometheus import promtool_check


def test_agent_metrics_follow_prometheus_conventions() -> None:
    metrics = AgentMetrics("agent-0")
    metrics.record(
        RoundRecord("agent-0", 7, 1.0, metrics={"accuracy": 0.9, "loss": 0.3},
                    scalars={"weight": 1.2, "disagreement": 0.01})
    )  # fmt: skip
    metrics.on_send(SendEvent("agent-1", 7, 1000, 0.004, "delivered"))
    metrics.on_send(SendEvent("agent-1", 7, 1000, 0.001, "dropped"))
    metrics.on_send(SendEvent("agent-2", 7, 500, 0.2, "failed", "UNAVAILABLE"))
    metrics.on_step(StepEvent(7, 0.02))
    metrics.on_receive(ReceiveEvent(True, "agent-2", payload_bytes=800))
    metrics.on_receive(ReceiveEvent(False, code="PERMISSION_DENIED", reason="not_in_neighbour"))
    text = generate_latest(metrics.registry).decode()
    promtool_check(text)
    assert "_created" not in text
    value = metrics.registry.get_sample_value
    assert value("airgossip_agent_sent_bytes_total", {"peer": "agent-1"}) == 2000
    assert value("airgossip_agent_messages_dropped_total", {"peer": "agent-1"}) == 1
    assert (
        value("airgossip_agent_messages_failed_total", {"peer": "agent-2", "code": "UNAVAILABLE"})
        == 1
    )
    assert value("airgossip_agent_push_latency_seconds_count", {"peer": "agent-1"}) == 1
    assert (
        value("airgossip_agent_push_latency_seconds_bucket", {"peer": "agent-1", "le": "0.005"})
        == 1
    )
    assert value("airgossip_agent_local_step_seconds_sum", {}) == pytest.approx(0.02)
    refused = {"code": "PERMISSION_DENIED", "reason": "not_in_neighbour"}
    assert value("airgossip_agent_messages_rejected_total", refused) == 1
    assert value("airgossip_agent_received_bytes_total", {"peer": "agent-2"}) == 800
    assert value("airgossip_agent_accuracy_ratio", {}) == 0.9
    assert value("airgossip_agent_round", {}) == 7
    # Every instance has its own registry: two agents in one process never collide.
    assert AgentMetrics("agent-1").registry is not metrics.registry


def test_agents_report_their_events_where_they_happen() -> None:
    settings = AgentSettings(task=TaskSettings(name="consensus", dim=6), rounds=5, seed=2)
    network = InMemoryNetwork()
    sinks = [MemoryStatsSink() for _ in range(3)]
    recorders = [Recorder() for _ in range(3)]
    exporters = [AgentMetrics(f"agent-{i}") for i in range(3)]
    latest = [LatestStats() for _ in range(3)]
    agents: list[Agent] = []
    for i in range(3):
        telemetry = Telemetry(sinks[i], recorders[i], exporters[i], latest[i])
        agents.append(
            build_agent(
                f"agent-{i}", index=i, num_agents=3, settings=settings,
                transport=InMemoryTransport(network, f"agent-{i}"),
                stats=telemetry, observer=telemetry,
            )
        )  # fmt: skip
    addresses = {a.agent_id: a.start() for a in agents}
    assignments = assignments_for_graph(build_graph("directed-ring", 3), addresses)
    for agent in agents:
        agent.set_assignment(assignments[agent.agent_id])
        agent.begin()
    for r in range(1, 6):
        for agent in agents:
            agent.local_step(r)
            agent.push(r)
        for agent in agents:
            agent.mix(r)
            agent.report(r)
    with pytest.raises(Rejected):
        agents[0].admit(
            MessageHeader(
                "mallory", 1, 1, 0, "push-sum", "float64", 6, 48, {"y": 1.0}, receiver="agent-0"
            )
        )
    for agent, recorder, exporter, keeper, sink in zip(
        agents, recorders, exporters, latest, sinks, strict=True
    ):
        steps = [e for e in recorder.events if isinstance(e, StepEvent)]
        sends = [e for e in recorder.events if isinstance(e, SendEvent)]
        received = [e for e in recorder.events if isinstance(e, ReceiveEvent) and e.accepted]
        assert [e.round for e in steps] == [1, 2, 3, 4, 5]
        assert all(e.seconds >= 0 for e in steps + sends)  # type: ignore[operator]
        assert len(sends) == 5 and all(e.outcome == "delivered" for e in sends)
        assert len(received) == 5
        counters = agent.counters()
        peer = next(iter(assignments[agent.agent_id].phase(1).out_weights))
        assert (
            exporter.registry.get_sample_value("airgossip_agent_sent_bytes_total", {"peer": peer})
            == counters.bytes_sent
        )
        snapshot = keeper.snapshot()
        assert snapshot.round == 5 and snapshot.links[peer].bytes_sent == counters.bytes_sent
        assert snapshot.push_sum_weight == pytest.approx(sink.records[-1].scalars["weight"])
        disagreement = sink.records[-1].scalars["disagreement"]
        assert 0 <= disagreement < sink.records[1].scalars["disagreement"]  # consensus nears
    refusals = [e for e in recorders[0].events if isinstance(e, ReceiveEvent) and not e.accepted]
    assert refusals == [ReceiveEvent(False, code="PERMISSION_DENIED", reason="not_in_neighbour")]
    for agent in agents:
        agent.close()


def small_fleet() -> tuple[Membership, FakeClock]:
    clock = FakeClock()
    spec = TopologySpec("directed-ring")
    fleet = Membership(
        expected=3, spec=spec, policy=make_policy(spec), store=FleetStore(None),
        liveness=LivenessSettings(1.0, 3.0), clock=clock, wall=clock,
    )  # fmt: skip
    for i in range(3):
        fleet.register(f"agent-{i}", f"127.0.0.1:{7000 + i}", "d", f"127.0.0.1:{9100 + i}")
    for i in range(3):
        peer = f"agent-{(i + 1) % 3}"
        fleet.heartbeat(
            f"agent-{i}",
            AgentSnapshot(round=10 + i, accuracy=0.8 + i / 100, loss=0.5,
                              counters=Counters(bytes_sent=1000 * i),
                          push_sum_weight=1.0, disagreement=0.1,
                          links={peer: LinkTotals(1000 * i, 10, 2, 1)}),
            assignment_epoch=1,
        )  # fmt: skip
    return fleet, clock


def test_coordinator_exposition_and_service_discovery() -> None:
    fleet, clock = small_fleet()
    server = metrics_server(fleet.view, "127.0.0.1:0")
    server.start()
    try:
        text = urllib.request.urlopen(f"http://{server.address}/metrics", timeout=10).read()
        promtool_check(text.decode())
        assert b"_created" not in text
        exposed = text.decode()
        for line in (
            "airgossip_fleet_agents_alive 3.0",
            'airgossip_fleet_link_sent_bytes_total{agent="agent-2",peer="agent-0"} 2000.0',
            'airgossip_fleet_link_messages_dropped_total{agent="agent-1",peer="agent-2"} 2.0',
            'airgossip_fleet_agent_accuracy_ratio{agent="agent-1"} 0.81',
            "airgossip_fleet_graph_strongly_connected 1.0",
        ):
            assert line in exposed.splitlines(), line
        lambda2 = next(
            line for line in exposed.splitlines() if line.startswith("airgossip_fleet_mixing")
        )
        assert float(lambda2.split()[1]) == pytest.approx(0.5)  # directed 3-ring, weights 1/2
        sd = json.loads(urllib.request.urlopen(f"http://{server.address}/sd", timeout=10).read())
        assert sd == [
            {"targets": [f"127.0.0.1:{9100 + i}"], "labels": {"agent": f"agent-{i}"}}
            for i in range(3)
        ]
        clock.now += 3.5
        fleet.heartbeat("agent-0", None, 1)
        fleet.heartbeat("agent-2", None, 1)
        assert fleet.expire() == ["agent-1"]
        text = urllib.request.urlopen(f"http://{server.address}/metrics", timeout=10).read()
        assert b'agent="agent-1"' not in text  # no stale series for the dead
        assert b"airgossip_fleet_agents_alive 2.0" in text
        assert b'airgossip_fleet_agents{state="dead"} 1.0' in text
        assert [g["labels"]["agent"] for g in service_discovery(fleet.view())] == [
            "agent-0", "agent-2",
        ]  # fmt: skip
        inspect = json.loads(
            urllib.request.urlopen(f"http://{server.address}/fleet", timeout=10).read()
        )
        assert inspect["epoch"] == 2 and inspect["strongly_connected"] is True
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://{server.address}/nope", timeout=10)
        assert info.value.code == 404
    finally:
        server.stop()


def test_service_discovery_keeps_finished_agents_and_drops_departed_ones() -> None:
    # A finished agent still serves its final state (while it lingers, or until stopped).
    fleet, _ = small_fleet()
    fleet.leave("agent-0", "finished")
    fleet.leave("agent-1", "stopped")
    states = {m.agent_id: m.state for m in fleet.view().members}
    assert states == {"agent-0": "finished", "agent-1": "left", "agent-2": "alive"}
    assert service_discovery(fleet.view()) == [
        {"targets": ["127.0.0.1:9100"], "labels": {"agent": "agent-0"}},
        {"targets": ["127.0.0.1:9102"], "labels": {"agent": "agent-2"}},
    ]


def test_metrics_server_refuses_a_busy_port_in_one_line() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}: the port"):
            MetricsServer(AgentMetrics("a").registry, f"127.0.0.1:{port}")
    with pytest.raises(OSError, match="expected host:port"):
        MetricsServer(AgentMetrics("a").registry, "localhost")
