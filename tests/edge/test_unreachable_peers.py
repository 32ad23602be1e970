"""An out-neighbour that cannot be reached must not swallow the fleet's mass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from airgossip.common.topology import Phase, assignments_for_graph, build_graph
from airgossip.edge.agent import PROBE_ROUNDS, Agent, build_agent, hold_back
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.tasks.consensus import ConsensusOptions, true_average
from airgossip.edge.transport import InMemoryNetwork, InMemoryTransport
from tests.support.agents import Recorder


def test_hold_back_keeps_the_share_home_and_probes_with_zero_weight() -> None:
    phase = Phase(0.25, {"a": 0.25, "b": 0.25, "c": 0.25}, ("a",))
    held = hold_back(phase, {"b", "zzz"}, probe=False)
    assert held == Phase(0.5, {"a": 0.25, "c": 0.25}, ("a",))
    probing = hold_back(phase, {"b"}, probe=True)
    assert probing == Phase(0.5, {"a": 0.25, "b": 0.0, "c": 0.25}, ("a",))
    assert hold_back(phase, {"zzz"}, probe=False) is phase


def test_a_partitioned_peer_costs_no_mass_and_rejoins_exactly() -> None:
    n = 3
    settings = AgentSettings(task=TaskSettings(name="consensus", dim=5), rounds=400, seed=3)
    network = InMemoryNetwork()
    recorder = Recorder()
    agents: list[Agent] = [
        build_agent(
            f"agent-{i}", index=i, num_agents=n, settings=settings,
            transport=InMemoryTransport(network, f"agent-{i}"),
            observer=recorder if i == 0 else None,
        )
        for i in range(n)
    ]  # fmt: skip
    addresses = {a.agent_id: a.start() for a in agents}
    assignments = assignments_for_graph(build_graph("complete", n), addresses)
    for agent in agents:
        agent.set_assignment(assignments[agent.agent_id])

    def rounds(live: list[Agent], span: range) -> None:
        for r in span:
            for agent in live:
                agent.local_step(r)
                agent.push(r)
            for agent in live:
                agent.mix(r)

    def live_weight(agent: Agent) -> float:
        """Push-sum weight the agent holds or has on its way to live peers (not agent-2)."""
        edges = agent.algorithm._out  # type: ignore[attr-defined]
        on_the_way = sum(e.sigma_y for peer, e in edges.items() if peer != "agent-2")
        return agent.algorithm.mass()[1] + on_the_way  # type: ignore[attr-defined,no-any-return]

    rounds(agents, range(1, 11))
    network.unbind(addresses["agent-2"])  # agent-2 drops off the network, frozen
    survivors = agents[:2]
    rounds(survivors, range(11, 13))
    before = sum(live_weight(a) for a in survivors)
    sends = len(recorder.events)
    rounds(survivors, range(13, 213))
    # Nothing more leaks towards agent-2: its edges got only zero-weight probes.
    assert before > 1.0  # of the 2 the survivors had, a round's share or so went to agent-2
    assert sum(live_weight(a) for a in survivors) == pytest.approx(before, rel=1e-12)
    probes = [
        e for e in recorder.events[sends:]
        if getattr(e, "peer", None) == "agent-2"
    ]  # fmt: skip
    assert len(probes) == 200 // PROBE_ROUNDS
    assert all(e.outcome == "failed" for e in probes)  # type: ignore[attr-defined]
    z0, z1 = (a.algorithm.estimate() for a in survivors)
    assert torch.allclose(z0, z1, rtol=1e-9)  # the survivors agree among themselves

    network.bind(addresses["agent-2"], agents[2])  # back, with the state it had
    rounds(agents, range(213, 401))
    target = true_average(3, n, ConsensusOptions(dim=5)).numpy()
    for agent in agents:
        error = np.linalg.norm(agent.algorithm.estimate().numpy() - target)
        assert error / np.linalg.norm(target) < 1e-10, agent.agent_id
