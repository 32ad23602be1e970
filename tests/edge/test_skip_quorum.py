"""No peer can make an agent skip its run.

An agent that restarts skips ahead to its fleet's round only on a quorum of distinct peers
(``airgossip.edge.agent.rejoin.fleet_round``): at least two, and a majority of those heard. One
insider naming any round it likes, in every message and acknowledgement, never moves it,
among 1, 2 or 3 honest peers; honest peers that agree the fleet is ahead still do. And an
agent whose in-neighbours all fell behind does not run off alone (``wait_over``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from airgossip.common.topology import assignments_for_graph, build_graph
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.agent.pacing import PATIENCE_ROUNDS, wait_over
from airgossip.edge.agent.rejoin import (
    MIN_QUORUM,
    REJOIN_GAP_ROUNDS,
    fleet_round,
    quorum,
    rejoin_round,
)
from airgossip.edge.agent.runner import WallClockRunner
from airgossip.edge.algorithms import Ack
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.transport.base import GossipMessage, SendCallback
from airgossip.edge.transport.memory import InMemoryNetwork, InMemoryTransport
from tests.support.agents import lock_step

HUGE = 10**6


# -- the rule ------------------------------------------------------------------------------------


def test_the_quorum_is_two_and_a_majority() -> None:
    assert [quorum(n) for n in range(1, 9)] == [2, 2, 2, 3, 3, 4, 4, 5]
    assert MIN_QUORUM == 2


@pytest.mark.parametrize("honest", [1, 2, 3])
@pytest.mark.parametrize("insider_round", [HUGE, 0])
def test_one_insider_among_honest_peers_never_moves_the_agent(
    honest: int, insider_round: int
) -> None:
    own = 5
    peers = {f"honest-{i}": own + i for i in range(honest)}  # the fleet is where the agent is
    peers["insider"] = insider_round
    fleet = fleet_round(peers)
    assert fleet is None or fleet <= max(peers[f"honest-{i}"] for i in range(honest))
    if fleet is not None:
        assert rejoin_round(own, fleet, rounds=10 * HUGE, staleness=2) is None


@pytest.mark.parametrize("honest", [1, 2, 3, 5, 8])
def test_the_insider_cannot_set_where_an_agent_skips_to(honest: int) -> None:
    """Honest peers well ahead: whatever the insider names, the agent goes no further than
    a round an honest peer reached."""
    peers = {f"honest-{i}": 130 + i for i in range(honest)}
    peers["insider"] = HUGE
    fleet = fleet_round(peers)
    if honest == 1:
        assert fleet == 130  # the quorum of two is the honest peer and the insider
    assert fleet is not None and fleet <= 130 + honest - 1


def test_one_peer_alone_never_makes_an_agent_skip() -> None:
    assert fleet_round({}) is None
    assert fleet_round({"insider": HUGE}) is None
    assert fleet_round({"honest": 130}) is None


def test_three_honest_peers_that_agree_the_fleet_is_ahead_do() -> None:
    fleet = fleet_round({"agent-1": 130, "agent-2": 131, "agent-3": 130})
    assert fleet == 130
    assert rejoin_round(30, fleet, rounds=1000, staleness=2) == 130
    # two of three agree, the third is behind the agent: the majority still carries it
    assert fleet_round({"agent-1": 130, "agent-2": 130, "agent-3": 25}) == 130


def test_two_insiders_are_beyond_what_the_rule_promises() -> None:
    """The guarantee is for one insider: two agreeing insiders are a quorum of three."""
    assert fleet_round({"a": HUGE, "b": HUGE, "honest": 5}) == HUGE


# -- real agents, one of them forging its rounds ------------------------------------------------


class ForgingTransport(InMemoryTransport):
    """An insider's transport: every message it sends names round ``forged``."""

    forged = HUGE

    def send(self, peer: str, address: str, message: GossipMessage, done: SendCallback) -> None:
        header = dataclasses.replace(message.header, round=self.forged)
        super().send(peer, address, dataclasses.replace(message, header=header), done)


def forge_acknowledgements(agent: Agent, forged: int) -> None:
    """The insider's acknowledgements name round ``forged`` too."""
    deliver = agent.deliver

    def forging(message: GossipMessage) -> Ack:
        return dataclasses.replace(deliver(message), round=forged)

    agent.deliver = forging  # type: ignore[method-assign]


def fleet_with_insider(tmp_path: Path, honest: int, forged: int, rounds: int) -> list[Agent]:
    """agent-0 (the one that decides), ``honest`` honest peers and the insider (last), all
    connected to each other."""
    n = honest + 2
    settings = AgentSettings(task=TaskSettings(name="consensus", dim=3), rounds=rounds, seed=3)
    network = InMemoryNetwork()
    agents = []
    for i in range(n):
        agent_id = f"agent-{i}"
        insider = i == n - 1
        transport = InMemoryTransport(network, agent_id)
        if insider:
            transport = ForgingTransport(network, agent_id)
            transport.forged = forged
        agents.append(
            build_agent(agent_id, index=i, num_agents=n, settings=settings, transport=transport)
        )
    addresses = {a.agent_id: a.start() for a in agents}
    assignments = assignments_for_graph(build_graph("complete", n), addresses)
    for agent in agents:
        agent.set_assignment(assignments[agent.agent_id])
    forge_acknowledgements(agents[-1], forged)
    return agents


@pytest.mark.parametrize("honest", [1, 2, 3])
@pytest.mark.parametrize("forged", [HUGE, 1000 - REJOIN_GAP_ROUNDS - 1])
def test_a_forging_peer_cannot_make_a_real_agent_skip(
    tmp_path: Path, honest: int, forged: int
) -> None:
    """The insider names ``forged`` in every message and acknowledgement (the largest round
    an agent would still skip to, or far beyond the run), many times over; the agent runs
    its first round, decides, and stays where it is."""
    agents = fleet_with_insider(tmp_path, honest, forged, rounds=1000)
    lock_step(agents, 1, 5)
    agent = agents[0]
    heard = agent.peer_rounds()
    assert heard[f"agent-{honest + 1}"] == forged  # heard, and counted once
    assert len(heard) == honest + 1
    runner = WallClockRunner(agent)
    runner.catch_up(wait_s=0.5)
    assert agent.round == 5
    lock_step(agents, 6, 8)  # it goes on with its fleet
    assert agent.round == 8


def test_honest_peers_ahead_still_bring_a_restarted_agent_to_their_round_not_the_insiders(
    tmp_path: Path,
) -> None:
    agents = fleet_with_insider(tmp_path, 3, HUGE, rounds=1000)
    lock_step(agents, 1, 130)
    late = agents[0]
    late.round = 30  # as if it had resumed an old checkpoint
    late.local_step(31)
    late.push(31)  # acknowledgements name the peers' rounds: 130, 130, 130 and the forgery
    WallClockRunner(late).catch_up(wait_s=0.5)
    assert late.round == 129  # the next round it runs is the honest fleet's


# -- nobody to pace it: an agent does not run off alone ------------------------------------------


def test_an_agent_waits_out_its_timeout_when_every_in_neighbour_is_far_behind() -> None:
    need = 100
    far = need - PATIENCE_ROUNDS - 1
    assert not wait_over([far, far, 3], need)  # every one is gone: the wait runs its course
    assert wait_over([far, need, 3], need)  # one is in reach: the stragglers are left
    assert not wait_over([far, need - 1], need)  # one within patience: waited for
    assert wait_over([need + 5, need], need)
    assert wait_over([], need)  # nobody to wait for this round


def test_a_real_agent_whose_in_neighbours_fell_silent_is_not_ready(tmp_path: Path) -> None:
    agents = fleet_with_insider(tmp_path, 2, HUGE, rounds=1000)[:3]  # the insider stays out
    lock_step(agents, 1, 3)
    alone = agents[0]
    for r in range(4, 4 + 2 + PATIENCE_ROUNDS + 2):  # only agent-0 runs: the others are silent
        alone.local_step(r)
        alone.push(r)
        alone.mix(r)
    r = alone.round + 1
    assert not alone.neighbours_ready(r)  # before: ready at once, round after round
