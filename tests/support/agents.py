"""Agents in this process: pairs and a consensus fleet serving real gRPC with mutual TLS on
loopback, pushes sent with a chosen certificate, a clock a test moves, an event recorder,
and rounds driven in lock step."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import grpc
import pytest

from airgossip.common.security.tls import dial, fleet_of
from airgossip.common.topology import assignments_for_graph, build_graph
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.agent.runner import WallClockRunner
from airgossip.edge.observability.telemetry import ReceiveEvent, SendEvent, StepEvent
from airgossip.edge.settings import AgentSettings
from airgossip.edge.transport import GossipMessage
from airgossip.edge.transport.base import LinkShaper
from airgossip.edge.transport.grpc_transport import GrpcTransport
from airgossip.edge.transport.wire import to_chunks
from airgossip.protos import gossip_pb2, gossip_pb2_grpc
from tests.support.tls import credentials


class FakeClock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """An agent observer that keeps every event."""

    def __init__(self) -> None:
        self.events: list[object] = []

    def on_send(self, event: SendEvent) -> None:
        self.events.append(event)

    def on_step(self, event: StepEvent) -> None:
        self.events.append(event)

    def on_receive(self, event: ReceiveEvent) -> None:
        self.events.append(event)


def grpc_pair(
    settings: AgentSettings, *, secure: bool = True, bulk_bytes: int | None = None
) -> Iterator[tuple[Agent, Agent]]:
    """Two agents serving real gRPC (mutual TLS unless ``secure`` is False) on loopback,
    neighbours of each other (fixture body); ``bulk_bytes``: the transports' bulk path."""
    security = {f"agent-{i}": credentials(f"agent-{i}") if secure else None for i in range(2)}
    agents = [
        build_agent(a, index=i, num_agents=2, settings=settings, fleet=fleet_of(security[a]),
                    transport=GrpcTransport(a, security=security[a], bulk_bytes=bulk_bytes))
        for i, a in enumerate(security)
    ]  # fmt: skip
    addresses = {a.agent_id: a.start() for a in agents}
    assignments = assignments_for_graph(build_graph("complete", 2), addresses)
    for agent in agents:
        agent.set_assignment(assignments[agent.agent_id])
    yield agents[0], agents[1]
    for agent in agents:
        agent.close()


def assert_pair_reaches_average(pair: tuple[Agent, Agent], timeout_s: float) -> None:
    """Run both agents to the end; each must hold the average of their vectors (1e-8), having
    refused nothing."""
    a, b = pair
    target = (a.task.initial_parameters() + b.task.initial_parameters()) / 2
    threads = [threading.Thread(target=WallClockRunner(agent).run) for agent in pair]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    assert not any(t.is_alive() for t in threads)
    for agent in pair:
        error = (agent.algorithm.estimate() - target).norm() / target.norm()
        assert float(error) < 1e-8
        assert agent.counters().messages_rejected == 0


def agent_channel(agent: Agent, identity: str | None = None) -> grpc.Channel:
    """A channel to ``agent`` as the transport would dial it: with TLS (if the agent serves
    it) under the certificate of ``identity`` (default: the agent's first in-neighbour)."""
    if getattr(agent.transport, "security", None) is None:
        return grpc.insecure_channel(agent.address)
    if identity is None:
        identity = next(iter(agent.assignment.phase(1).in_neighbours))  # type: ignore[union-attr]
    return dial(agent.address, agent.agent_id, credentials(identity))


def push(
    agent: Agent, message: GossipMessage, *, identity: str | None = None
) -> gossip_pb2.PushAck:
    """Push ``message`` to ``agent`` over a fresh channel, with the certificate of
    ``identity`` (default: the message's sender)."""
    with agent_channel(agent, identity or message.header.sender) as channel:
        return gossip_pb2_grpc.GossipStub(channel).Push(to_chunks(message, 16), timeout=5)


def refused(agent: Agent, message: GossipMessage, *, identity: str | None = None) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        push(agent, message, identity=identity)
    return info.value


class TlsFleet:
    """A consensus fleet of agents in this process, each serving real gRPC with mutual TLS
    (the test CA's certificates), on the exponential graph. Tests attack it, then
    :meth:`run_to_end` and check :meth:`relative_error`."""

    def __init__(
        self, n: int = 4, *, rounds: int = 60, dim: int = 8, seed: int = 5,
        bulk_bytes: int | None = None, shaper: LinkShaper | None = None,
    ) -> None:  # fmt: skip
        from airgossip.edge.settings import TaskSettings

        self.settings = AgentSettings(
            task=TaskSettings(name="consensus", dim=dim), rounds=rounds, wait_timeout_s=0.5,
            seed=seed,
        )  # fmt: skip
        self.dim = dim
        self.ids = [f"agent-{i}" for i in range(n)]
        self.agents: list[Agent] = []
        for i, agent_id in enumerate(self.ids):
            security = credentials(agent_id)
            transport = GrpcTransport(
                agent_id, security=security, bulk_bytes=bulk_bytes, shaper=shaper
            )
            self.agents.append(
                build_agent(agent_id, index=i, num_agents=n, settings=self.settings,
                            transport=transport, fleet=fleet_of(security))
            )  # fmt: skip
        addresses = {a.agent_id: a.start() for a in self.agents}
        assignments = assignments_for_graph(build_graph("exponential", n), addresses)
        for agent in self.agents:
            agent.set_assignment(assignments[agent.agent_id])

    def __getitem__(self, agent_id: str) -> Agent:
        return self.agents[self.ids.index(agent_id)]

    def start_running(self) -> None:
        """Run every agent in a thread of its own (see :meth:`join`)."""
        self._threads = [
            threading.Thread(target=WallClockRunner(a).run, daemon=True) for a in self.agents
        ]
        for thread in self._threads:
            thread.start()

    def join(self, timeout_s: float = 120) -> None:
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        assert not any(t.is_alive() for t in self._threads), "the fleet did not finish in time"

    def run_to_end(self, timeout_s: float = 120) -> None:
        self.start_running()
        self.join(timeout_s)

    def relative_error(self) -> float:
        """Largest relative error of an agent's estimate against the exact average."""
        from airgossip.edge.tasks.consensus import ConsensusOptions, true_average

        target = true_average(self.settings.seed, len(self.ids), ConsensusOptions(dim=self.dim))
        return max(
            float((a.algorithm.estimate() - target).norm() / target.norm()) for a in self.agents
        )

    def close(self) -> None:
        for agent in self.agents:
            agent.close()


def lock_step(agents: Sequence[Agent], first: int, last: int) -> None:
    """Drive ``agents`` through rounds ``first`` to ``last`` in lock step: every agent trains
    and pushes, then every agent mixes what it received."""
    for r in range(first, last + 1):
        for agent in agents:
            agent.local_step(r)
            agent.push(r)
        for agent in agents:
            agent.mix(r)
