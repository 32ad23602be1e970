"""Whole in-process fleets: the claims of the papers (C2, C3), compressed and tracking
algorithms on digits, graph switching during a run, and honest byte counts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airgossip.common.topology import assignments_for_graph, build_graph, transition
from airgossip.coordinator.membership import Membership
from airgossip.coordinator.policy import TopologySpec, make_policy
from airgossip.coordinator.store import FleetStore
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.observability.stats import MemoryStatsSink
from airgossip.edge.tasks.consensus import ConsensusOptions, true_average
from airgossip.edge.transport import GossipMessage, InMemoryNetwork, InMemoryTransport
from airgossip.edge.transport.base import SendCallback
from airgossip.edge.transport.wire import GRPC_FRAME_BYTES, to_chunks
from airgossip.emulation.fleets import preflight, run_fleet
from airgossip.emulation.fleets.inproc import run_in_process
from airgossip.emulation.networks import network_for
from airgossip.scenario.config import ConfigError, load_config
from airgossip.scenario.results import relative_error, summarise

NON_IID = {"name": "digits", "partition": "dirichlet", "alpha": 0.1}


def learn(**settings: Any) -> dict[str, Any]:
    """Final figures of a seeded in-process digits fleet (16 agents, 80 rounds, 10% loss)."""
    base: dict[str, Any] = {"mode": "inproc", "agents": 16, "rounds": 80, "task": NON_IID}
    config = load_config(None, {**base, **settings})
    preflight(config)
    final: dict[str, Any] = summarise(run_in_process(config)).to_json()["final"]
    return final


# -- C2: connectivity under non-IID data, 4-bit quantized push-sum ---------------------------
@pytest.mark.slow
def test_c2_accuracy_follows_connectivity_and_4_bits_cost_nothing() -> None:
    accuracy = {
        topology: learn(topology=topology)["mean_accuracy"]
        for topology in ("complete", "exponential", "ring")
    }
    assert accuracy["complete"] >= accuracy["exponential"] - 0.005
    assert accuracy["exponential"] >= accuracy["ring"] - 0.005
    assert accuracy["complete"] > accuracy["ring"] + 0.02  # non-IID: the ring really hurts

    exact = learn(algorithm="quantized-push-sum")
    quantized = learn(algorithm="quantized-push-sum", compression="qsgd:4")
    assert abs(quantized["mean_accuracy"] - exact["mean_accuracy"]) <= 0.01
    assert exact["bytes_sent"] >= 7 * quantized["bytes_sent"]


# -- C3: lossy links, whole fleets -----------------------------------------------------------
def consensus(algorithm: str, loss: float, **settings: Any) -> float:
    config = load_config(None, {
        "mode": "inproc", "task": {"name": "consensus"}, "agents": 16, "rounds": 200,
        "algorithm": algorithm, "network": {"loss": loss}, **settings,
    })  # fmt: skip
    records = run_in_process(config)
    estimates = [r[-1].estimate for r in records.values()]
    reference = true_average(config.seed, config.agents, ConsensusOptions()).numpy()
    error = relative_error([e for e in estimates if e is not None], reference)
    assert error is not None
    return error


@pytest.mark.slow
@pytest.mark.parametrize("loss", [0.1, 0.3])
def test_c3_push_sum_is_exact_under_loss_and_plain_push_sum_is_not(loss: float) -> None:
    assert consensus("push-sum", loss) < 1e-10
    assert consensus("push-sum-plain", loss) > 1e-2


@pytest.mark.parametrize("loss", [0.1, 0.3])
def test_quantized_push_sum_fleet_is_exact_under_loss(loss: float) -> None:
    error = consensus("quantized-push-sum", loss, compression="qsgd:4", agents=8, rounds=120)
    assert error < 1e-10


# -- choco with a 1% sparsifier, gradient tracking on non-IID data ---------------------------
@pytest.mark.slow
def test_choco_with_top_1_percent_is_within_0_02_of_uncompressed() -> None:
    settings = {"algorithm": "choco", "topology": "ring", "rounds": 120, "task": {"name": "digits"}}
    uncompressed = learn(**settings)
    sparse = learn(**settings, compression="topk:0.01")
    assert sparse["mean_accuracy"] >= uncompressed["mean_accuracy"] - 0.02
    assert uncompressed["bytes_sent"] > 30 * sparse["bytes_sent"]


@pytest.mark.slow
def test_gradient_tracking_beats_push_sum_on_strongly_non_iid_data() -> None:
    sgp = learn(algorithm="push-sum", topology="ring")
    tracking = learn(algorithm="gradient-tracking", topology="ring")
    assert tracking["mean_accuracy"] > sgp["mean_accuracy"] + 0.02
    assert tracking["min_accuracy"] > sgp["min_accuracy"]


# -- the graph changes during a run; agents keep their state ---------------------------------
@dataclass
class Fleet:
    agents: list[Agent]
    addresses: dict[str, str]
    sink: MemoryStatsSink


def start_fleet(algorithm: str, n: int, loss: float, **settings: Any) -> Fleet:
    config = load_config(None, {
        "mode": "inproc", "task": {"name": "consensus", "dim": 30}, "agents": n,
        "algorithm": algorithm, "network": {"loss": loss}, "rounds": 1000, **settings,
    })  # fmt: skip
    network, sink = InMemoryNetwork(), MemoryStatsSink()
    shaper = network_for(config).runtime([]).shaper
    agents = [
        build_agent(f"agent-{i}", index=i, num_agents=n, settings=config.agent_settings(),
                    transport=InMemoryTransport(network, f"agent-{i}", shaper=shaper), stats=sink)
        for i in range(n)
    ]  # fmt: skip
    return Fleet(agents, {a.agent_id: a.start() for a in agents}, sink)


def lock_step(fleet: Fleet, first: int, last: int) -> None:
    for round_index in range(first, last + 1):
        for agent in fleet.agents:
            agent.local_step(round_index)
            agent.push(round_index)
        for agent in fleet.agents:
            agent.mix(round_index)


@pytest.mark.parametrize(
    ("algorithm", "settings"),
    [("push-sum", {}), ("quantized-push-sum", {"compression": "qsgd:4"})],
)
def test_switching_the_graph_mid_run_keeps_the_agents_and_stays_exact(
    algorithm: str, settings: dict[str, Any]
) -> None:
    n = 12
    fleet = start_fleet(algorithm, n, loss=0.2, **settings)
    before = list(fleet.agents)
    names = ["exponential", "ring", "one-peer-exponential", "erdos-renyi"]
    graphs = [build_graph(name, n, seed=3) for name in names]
    current = assignments_for_graph(graphs[0], fleet.addresses)
    for agent in fleet.agents:
        agent.set_assignment(current[agent.agent_id])
    start = 1
    for epoch, graph in enumerate(graphs[1:], start=2):
        # Switch early, while agents still disagree: mass stranded on an edge that left the
        # graph would then move the fleet's answer for good.
        lock_step(fleet, start, start + 3)
        start += 4
        new = assignments_for_graph(graph, fleet.addresses, epoch=epoch)
        for agent in fleet.agents:  # switch while the agents keep their gossip state
            agent.set_assignment(transition(current[agent.agent_id], new[agent.agent_id]))
        current = new
    lock_step(fleet, start, start + 150)
    assert fleet.agents == before and all(a.assignment is not None for a in fleet.agents)
    assert {a.assignment.epoch for a in fleet.agents if a.assignment} == {len(graphs)}
    reference = true_average(0, n, ConsensusOptions(dim=30)).numpy()
    estimates = [a.algorithm.estimate().numpy() for a in fleet.agents]
    error = relative_error(estimates, reference)
    assert error is not None and error < 1e-10
    assert sum(a.counters().messages_dropped for a in fleet.agents) > 100  # lossy all along
    for agent in fleet.agents:
        agent.close()


# -- bytes_sent is what went on the wire -----------------------------------------------------
class RecordingTransport(InMemoryTransport):
    """Adds up the real protobuf chunks of every message it sends."""

    measured = 0

    def send(self, peer: str, address: str, message: GossipMessage, done: SendCallback) -> None:
        chunks = to_chunks(message)
        RecordingTransport.measured += sum(GRPC_FRAME_BYTES + c.ByteSize() for c in chunks)
        super().send(peer, address, message, done)


@pytest.mark.parametrize(
    ("algorithm", "compression"),
    [("quantized-push-sum", "qsgd:4"), ("choco", "topk:0.05"), ("gradient-tracking", "qsgd:3"),
     ("dpsgd", "bf16"), ("push-sum", "randomk:0.2")],
)  # fmt: skip
def test_bytes_sent_counts_the_real_chunks(algorithm: str, compression: str) -> None:
    config = load_config(None, {
        "mode": "inproc", "agents": 4, "rounds": 6, "algorithm": algorithm, "topology": "ring",
        "compression": compression, "task": {"name": "digits", "local_steps": 1},
        "network": {"loss": 0.3},
    })  # fmt: skip
    RecordingTransport.measured = 0
    network, shaper = InMemoryNetwork(), network_for(config).runtime([]).shaper
    agents = [
        build_agent(f"agent-{i}", index=i, num_agents=4, settings=config.agent_settings(),
                    transport=RecordingTransport(network, f"agent-{i}", shaper=shaper))
        for i in range(4)
    ]  # fmt: skip
    addresses = {a.agent_id: a.start() for a in agents}
    scheme = agents[0].algorithm.mixing
    assignments = assignments_for_graph(build_graph("ring", 4), addresses, scheme=scheme)
    for agent in agents:
        agent.set_assignment(assignments[agent.agent_id])
    for r in range(1, 7):
        for agent in agents:
            agent.local_step(r)
            agent.push(r)
        for agent in agents:
            agent.mix(r)
    assert sum(a.counters().bytes_sent for a in agents) == RecordingTransport.measured > 0
    raw = 4 * agents[0].algorithm.numel  # float32 bytes of one model
    per_message = RecordingTransport.measured / sum(a.counters().messages_sent for a in agents)
    assert per_message < raw * (2 if algorithm == "gradient-tracking" else 1)


# -- algorithms that need undirected graphs get them, with the right weights -----------------
@pytest.mark.parametrize("algorithm", ["dpsgd", "choco"])
def test_undirected_algorithms_refuse_directed_graphs_at_start(
    algorithm: str, tmp_path: Path
) -> None:
    settings = {"mode": "inproc", "algorithm": algorithm, "topology": "exponential"}
    config = load_config(None, settings)
    with pytest.raises(ConfigError, match=f"algorithm '{algorithm}' needs an undirected graph"):
        run_fleet(config, tmp_path)
    assert not (tmp_path / "results.json").exists()


def test_metropolis_hastings_weights_reach_the_agents_and_results(tmp_path: Path) -> None:
    config = load_config(None, {
        "mode": "inproc", "algorithm": "dpsgd", "topology": "ring", "agents": 6, "rounds": 40,
        "task": {"name": "consensus"}, "network": {"loss": 0.0},
    })  # fmt: skip
    results = run_fleet(config, tmp_path).to_json()
    assert results["config"]["lambda2"] == pytest.approx(1 / 3 + 2 / 3 * 0.5)  # MH ring, n=6
    assert results["final"]["relative_error"] < 1e-6
    spec = TopologySpec("complete", scheme="metropolis-hastings")
    fleet = Membership(expected=2, spec=spec, policy=make_policy(spec), store=FleetStore(None))
    fleet.register("agent-0", "a:1", "d")
    fleet.register("agent-1", "b:1", "d")
    assert fleet.assignments["agent-0"].phase(0).out_weights == {"agent-1": 0.5}
