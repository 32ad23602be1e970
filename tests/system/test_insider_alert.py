"""An authenticated insider fires the shipped alert in a real Prometheus, naming it.

Two consensus fleets of eight agents run side by side in this process, each agent serving
real gRPC with mutual TLS (the test CA's certificates) and its own ``/metrics`` over real
HTTP, on the exponential graph (three in-neighbours each). Debian's Prometheus scrapes all
sixteen every second and evaluates ``deploy/prometheus/alerts.yml`` as shipped, every
second: ``AirgossipSuspectedInsider`` must name agent-0 within :data:`ALERT_ROUNDS` rounds
of its first forged push, and nothing may fire in the honest fleet.

In one fleet agent-0, with its genuine key, replaces its pushes with the forged ones of
issue 17 (y = 1000, x = 1000 * y on every element, numbered from the acknowledgements it
gets back); the other fleet stays honest. Rounds run in lock step, one every
:data:`ROUND_S` seconds (what a round is worth in alert latency is in docs/security.md).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from edge.agent import Agent, build_agent
from edge.config.settings import AgentSettings, TaskSettings
from edge.observability.http import MetricsServer
from edge.observability.metrics import AgentMetrics
from edge.security.tls import fleet_of
from edge.topology import assignments_for_graph, build_graph
from edge.transport import GossipMessage
from edge.transport.base import MessageHeader, SendCallback, SendOutcome, Transport
from edge.transport.grpc_transport import GrpcTransport
from tests.support.agents import refused
from tests.support.cli import ROOT
from tests.support.prometheus import Prometheus
from tests.support.tls import credentials

pytestmark = pytest.mark.slow

AGENTS = 8
INSIDER = "agent-0"
#: Seconds per lock-step round.
ROUND_S = 1.0
#: Honest rounds before the first forged push (Prometheus holds a few scrapes of every series).
WARM_ROUNDS = 4
#: The issue's bound: the alert fires within this many rounds of the first forged push.
ALERT_ROUNDS = 10


class Forger:
    """agent-0's transport, turned: passes genuine pushes through until :attr:`forging`, then
    sends forged ones in their place, numbered from the latest acknowledgement of each edge."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.forging = False
        self.forged = 0
        self.acked: dict[str, int] = {}
        self.headers: dict[str, MessageHeader] = {}  # the latest sent to each peer

    def start(self, handler: Any) -> str:
        return self.inner.start(handler)

    def send(self, peer: str, address: str, message: GossipMessage, done: SendCallback) -> None:
        if self.forging:
            header = message.header
            assert header.codec == "float64", header.codec
            last = self.acked.get(peer, 0)
            forged = dataclasses.replace(header, seq=last + 1, base_seq=last, scalars={"y": 1000.0})
            data = torch.full((header.numel,), 1000.0 * 1000.0, dtype=torch.float64)
            message = GossipMessage(forged, data.numpy().tobytes())
            self.forged += 1
        self.headers[peer] = message.header

        def acknowledged(outcome: SendOutcome) -> None:
            if outcome.ack is not None:
                self.acked[peer] = max(self.acked.get(peer, 0), outcome.ack.last_seq)
            done(outcome)

        self.inner.send(peer, address, message, acknowledged)

    def close(self) -> None:
        self.inner.close()


class WatchedFleet:
    """Eight consensus agents on mutual TLS, each with its metrics served over HTTP."""

    def __init__(self, name: str, *, insider: bool) -> None:
        self.name = name
        settings = AgentSettings(
            task=TaskSettings(name="consensus", dim=8), rounds=1000, wait_timeout_s=0.5, seed=3
        )
        self.agents: list[Agent] = []
        self.servers: list[MetricsServer] = []
        self.forger: Forger | None = None
        graph = build_graph("exponential", AGENTS)
        for i in range(AGENTS):
            agent_id = f"agent-{i}"
            security = credentials(agent_id)
            transport: Transport = GrpcTransport(agent_id, security=security)
            if insider and agent_id == INSIDER:
                transport = self.forger = Forger(transport)
            metrics = AgentMetrics(agent_id)
            self.agents.append(
                build_agent(agent_id, index=i, num_agents=AGENTS, settings=settings,
                            transport=transport, fleet=fleet_of(security), observer=metrics)
            )  # fmt: skip
            server = MetricsServer(metrics.registry, "127.0.0.1:0")
            server.start()
            self.servers.append(server)
        addresses = {a.agent_id: a.start() for a in self.agents}
        assignments = assignments_for_graph(graph, addresses)
        for agent in self.agents:
            agent.set_assignment(assignments[agent.agent_id])

    def scrape_config(self) -> str:
        targets = "".join(
            f"      - targets: ['{server.address}']\n"
            f"        labels: {{agent: {agent.agent_id}, fleet: {self.name}}}\n"
            for agent, server in zip(self.agents, self.servers, strict=True)
        )
        return f"  - job_name: {self.name}\n    static_configs:\n{targets}"

    def push(self, round_index: int) -> None:
        for agent in self.agents:
            agent.local_step(round_index)
            agent.push(round_index)

    def settled(self) -> bool:
        return all(not agent.outbox.inflight for agent in self.agents)

    def mix(self, round_index: int) -> None:
        for agent in self.agents:
            agent.mix(round_index)

    def spread(self) -> float:
        """Largest element of any agent's estimate, in magnitude."""
        return max(float(a.algorithm.estimate().abs().max()) for a in self.agents)

    def close(self) -> None:
        for agent in self.agents:
            agent.close()
        for server in self.servers:
            server.stop()


@pytest.fixture
def fleets() -> Iterator[tuple[WatchedFleet, WatchedFleet]]:
    attacked = WatchedFleet("attacked", insider=True)
    clean = WatchedFleet("clean", insider=False)
    try:
        yield attacked, clean
    finally:
        attacked.close()
        clean.close()


def firing(prometheus: Prometheus) -> list[dict[str, str]]:
    """Labels of every firing alert."""
    alerts = prometheus.get("/api/v1/alerts")["data"]["alerts"]
    return [a["labels"] for a in alerts if a["state"] == "firing"]


def insider_panels() -> list[tuple[str, str]]:
    """``(title, query)`` of the agent dashboard's insider panels, variables substituted."""
    data = json.loads((ROOT / "deploy/grafana/dashboards/airgossip-agent.json").read_text())
    titles = {
        "Relative increment per in-neighbour",
        "Refusals and clips per in-neighbour",
        "Insider alerts firing",
    }
    panels = [p for p in data["panels"] if p["title"] in titles]
    assert {p["title"] for p in panels} == titles
    variables = {"$__rate_interval": "20s", "$agent": ".*", "$peer": ".*"}
    found = []
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in variables.items():
                expr = expr.replace(name, value)
            found.append((panel["title"], expr))
    return found


def run_round(fleets: tuple[WatchedFleet, ...], round_index: int) -> None:
    """One lock-step round of every fleet, paced to :data:`ROUND_S`."""
    began = time.monotonic()
    for fleet in fleets:
        fleet.push(round_index)
    deadline = began + 5
    while not all(f.settled() for f in fleets):
        assert time.monotonic() < deadline, "pushes did not finish"
        time.sleep(0.005)
    for fleet in fleets:
        fleet.mix(round_index)
    time.sleep(max(0.0, began + ROUND_S - time.monotonic()))


def test_a_forging_insider_fires_the_shipped_alert_naming_it(
    fleets: tuple[WatchedFleet, WatchedFleet], tmp_path: Path
) -> None:
    attacked, clean = fleets
    rules = tmp_path / "alerts.yml"
    shutil.copy(ROOT / "deploy" / "prometheus" / "alerts.yml", rules)
    scrape = attacked.scrape_config() + clean.scrape_config()
    prometheus = Prometheus(tmp_path, scrape, rules=rules)
    try:
        deadline = time.monotonic() + 30
        while not prometheus.ready():
            assert time.monotonic() < deadline, prometheus.log.read_text()
            time.sleep(0.1)
        while len(prometheus.query("up == 1")) < 2 * AGENTS:
            assert time.monotonic() < deadline, prometheus.get("/api/v1/targets")
            time.sleep(0.2)
        round_index = 0
        for _ in range(WARM_ROUNDS):
            round_index += 1
            run_round(fleets, round_index)
        assert not firing(prometheus)
        assert attacked.forger is not None
        attacked.forger.forging = True
        fired_after: int | None = None
        seen: list[dict[str, str]] = []
        for attack_round in range(1, ALERT_ROUNDS + 1):
            round_index += 1
            run_round(fleets, round_index)
            seen += firing(prometheus)
            if fired_after is None and any(
                a["alertname"] == "AirgossipSuspectedInsider" for a in seen
            ):
                fired_after = attack_round
        assert attacked.forger.forged >= 3 * ALERT_ROUNDS  # every round, to all three victims
        assert attacked.spread() > 100  # the forgery took: the fleet follows the insider
        named = sorted({(a["alertname"], a.get("agent", "-"), a["peer"]) for a in seen})
        print(f"alert fired {fired_after} rounds after the first forged push; firing: {named}")
        assert fired_after is not None and fired_after <= ALERT_ROUNDS, seen
        assert all(a["job"] == "attacked" for a in seen), seen  # nothing in the clean fleet
        suspects = {a["peer"] for a in seen if a["alertname"] == "AirgossipSuspectedInsider"}
        assert suspects == {INSIDER}, named
        outliers = {(a["agent"], a["peer"]) for a in seen if a["alertname"].endswith("Outlier")}
        # every accusation names the insider, but those of the insider's own /metrics
        assert all(INSIDER in pair for pair in outliers), named
        assert len({agent for agent, peer in outliers if peer == INSIDER}) >= 2, named
        assert clean.spread() < 10
        # A push the victims refuse is charged to the insider, by reason.
        for peer, header in attacked.forger.headers.items():
            bad = dataclasses.replace(header, seq=header.seq + 1, scalars={"y": -5.0})
            victim = attacked.agents[int(peer.split("-")[1])]
            assert refused(victim, GossipMessage(bad, b"\0" * header.payload_bytes)).code() == (
                grpc.StatusCode.INVALID_ARGUMENT
            )
        charged = 'airgossip_agent_in_neighbour_refused_total{job="attacked", peer="agent-0"}'
        deadline = time.monotonic() + 10
        while len(prometheus.query(charged)) < len(attacked.forger.headers):
            assert time.monotonic() < deadline, prometheus.query(charged)
            time.sleep(0.2)
        assert {r["metric"]["reason"] for r in prometheus.query(charged)} == {"weight"}
        # The agent dashboard's insider panels draw from this Prometheus.
        for title, expr in insider_panels():
            result = prometheus.query(expr)
            assert result, (title, expr)
            if title == "Insider alerts firing":
                assert INSIDER in {r["metric"].get("peer") for r in result}, result
    finally:
        prometheus.close()
