"""Where an agent's neighbours and settings come from: a static peer list (the network's
topology over the listed ids, every peer answering before the rounds start), or the
coordinator's run (the fleet's scenario, with the settings each agent makes for itself)."""

from __future__ import annotations

import logging
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from airgossip.common.identity import natural_order
from airgossip.common.security.tls import TlsCredentials, dial
from airgossip.common.topology import Assignment, TopologyError, assignments_for_graph
from airgossip.coordinator.client import RunInfo
from airgossip.coordinator.run import PER_AGENT_SETTINGS
from airgossip.edge.agent.waiting import WaitReporter
from airgossip.node.network import Network
from airgossip.scenario.config import ConfigError, RunConfig, Settings, load_config, merge

log = logging.getLogger("airgossip.agent")


def static_assignment(network: Network, agent_id: str, peers: dict[str, str]) -> Assignment:
    """This agent's neighbours from a static peer list (no coordinator): the network's
    topology over the listed ids in natural order."""
    if agent_id not in peers:
        raise ConfigError(f"agent id '{agent_id}' is not in the peer list ({', '.join(peers)})")
    ids = natural_order(peers)
    try:
        graph = network.topology().graph(len(ids))
    except TopologyError as err:
        raise ConfigError(str(err)) from None
    return assignments_for_graph(graph, {i: peers[i] for i in ids}, scheme=network.scheme)[agent_id]


def wait_for_peers(
    agent_id: str,
    assignment: Assignment,
    timeout_s: float,
    stop: threading.Event,
    security: TlsCredentials | None = None,
) -> None:
    """Wait until every peer answers the gRPC health check (bounded by ``timeout_s``),
    saying every few seconds which peers it still waits for."""
    deadline = time.monotonic() + timeout_s
    pending = dict(assignment.peers)
    pending.pop(agent_id, None)
    waiting = WaitReporter(agent_id, "its peers")
    while pending and time.monotonic() < deadline and not stop.is_set():
        for peer, address in list(pending.items()):
            with dial(address, peer, security) as channel:
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=""), timeout=1.0
                    )
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        pending.pop(peer)
                except grpc.RpcError:
                    pass
        if pending:
            waiting.tick(
                f"{len(pending)} of {len(assignment.peers) - 1} not answering yet: "
                + ", ".join(f"{p} ({a})" for p, a in pending.items())
            )
            stop.wait(0.2)
    if pending and not stop.is_set():
        log.warning("%s starting without hearing from: %s", agent_id, ", ".join(pending))


def fleet_config(
    run: RunInfo, own: RunConfig | None, declared: Settings | None, coordinator: str
) -> RunConfig:
    """The config the agent runs: the fleet's scenario from the coordinator (with the
    settings an agent chooses for itself taken from its own), or its own when the coordinator
    hands out none."""
    if run.scenario is None:
        if own is None:
            raise ConfigError(
                f"the coordinator at {coordinator} hands out no scenario; give the agent --config"
            )
        return own
    mine = {k: v for k, v in (declared or {}).items() if k in PER_AGENT_SETTINGS}
    try:
        return load_config(None, merge(run.scenario, mine))
    except ConfigError as err:
        raise ConfigError(f"the coordinator's scenario: {err}") from None


def static_fleet_config(
    config: RunConfig, peers: dict[str, str], declared: Settings | None
) -> RunConfig:
    """With static peers the peer list says how many agents there are; a scenario that sets
    another fleet size is refused."""
    if declared is not None and "agents" in declared and config.agents != len(peers):
        raise ConfigError(
            f"the peer list names {len(peers)} agents; the scenario says agents = "
            f"{config.agents} (drop agents from the scenario, or list every agent)"
        )
    return config.model_copy(update={"agents": len(peers)})
