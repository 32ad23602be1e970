"""Agents restarted mid-run (from a checkpoint of any age, or from none) rejoin safely.

Real agents over the in-memory transport, on a lossy exponential graph, in lock step. A "crash"
replaces an agent by a new one (same id and address) that resumes from a checkpoint written long
before, or from nothing; its peers go on as they were. The new agent starts every edge over in a new
lineage (``airgossip.edge.agent.lineage``), so the fleet's mass changes by exactly what the restart
took away (the agent's state since its checkpoint, and what was in flight on its out-edges) and
nothing else: no non-finite value, no weight drained into an edge that never delivers, and the fleet
still agrees.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

from airgossip.common.topology import Assignment, assignments_for_graph, build_graph
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.agent.checkpoints import CheckpointStore
from airgossip.edge.agent.rejoin import LATE_WEIGHT
from airgossip.edge.agent.runner import WallClockRunner
from airgossip.edge.algorithms.push_sum import PushSum
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.transport.base import LinkVerdict
from airgossip.edge.transport.memory import InMemoryNetwork, InMemoryTransport


class BernoulliLoss:
    """Drops each message with probability ``loss`` (seeded)."""

    def __init__(self, loss: float, seed: int) -> None:
        self.loss = loss
        self.rng = random.Random(seed)

    def plan(self, sender: str, receiver: str, round: int, index: int, nbytes: int) -> LinkVerdict:
        return LinkVerdict(drop=self.rng.random() < self.loss)


class RejoinFleet:
    def __init__(self, folder: Path, n: int, *, loss: float, seed: int = 7) -> None:
        self.folder, self.n = folder, n
        self.settings = AgentSettings(
            task=TaskSettings(name="consensus", dim=5), rounds=1000, seed=seed
        )
        self.network = InMemoryNetwork()
        self.shaper = BernoulliLoss(loss, seed)
        self.agents = [self.build(i) for i in range(n)]
        addresses = {a.agent_id: a.start() for a in self.agents}
        self.assignments: dict[str, Assignment] = assignments_for_graph(
            build_graph("exponential", n), addresses
        )
        for agent in self.agents:
            agent.set_assignment(self.assignments[agent.agent_id])
        self.round = 0

    def build(self, i: int, checkpoints: Path | None = None, incarnation: int = 0) -> Agent:
        agent_id = f"agent-{i}"
        return build_agent(
            agent_id, index=i, num_agents=self.n, settings=self.settings,
            transport=InMemoryTransport(self.network, agent_id, shaper=self.shaper),
            checkpoints=CheckpointStore(checkpoints or self.folder / agent_id, agent_id),
            incarnation=incarnation,
        )  # fmt: skip

    def run(self, rounds: int) -> None:
        for _ in range(rounds):
            self.round += 1
            for agent in self.agents:
                agent.local_step(self.round)
                agent.push(self.round)
            for agent in self.agents:
                agent.mix(self.round)

    def keep_checkpoint(self, i: int, name: str) -> Path:
        """Write agent ``i``'s checkpoint now and keep a copy of its folder aside."""
        self.agents[i].checkpoint()
        aside = self.folder / name / f"agent-{i}"
        shutil.copytree(self.folder / f"agent-{i}", aside)
        return aside

    def restart(self, i: int, checkpoint: Path | None) -> int | None:
        """kill -9 agent ``i`` and start it again from ``checkpoint`` (None: no checkpoint)."""
        self.agents[i].transport.close()
        empty = self.folder / "empty" / f"agent-{i}-{self.round}"
        agent = self.build(i, checkpoint or empty, incarnation=1 + self.round)
        agent.start()
        agent.set_assignment(self.assignments[agent.agent_id])
        self.agents[i] = agent
        return agent.resume()

    def algorithm(self, i: int) -> PushSum:
        algorithm = self.agents[i].algorithm
        assert isinstance(algorithm, PushSum)
        return algorithm

    def held(self, i: int) -> tuple[torch.Tensor, float]:
        """What agent ``i`` holds and what it has given its out-edges and not had absorbed."""
        algorithm = self.algorithm(i)
        x, y = algorithm.mass()
        x, y = x.clone(), float(y)
        for peer in self.assignments[f"agent-{i}"].peers:
            sx, sy, _ = algorithm.out_edge_sum(peer)
            x += sx
            y += sy
        return x, y

    def total(self) -> tuple[torch.Tensor, float]:
        """The fleet's mass: every agent's state plus what its out-edges carry. (Messages are
        delivered inline, so nothing else is in flight between rounds.)"""
        parts = [self.held(i) for i in range(self.n)]
        return sum((p[0] for p in parts), torch.zeros(5, dtype=torch.float64)), sum(
            p[1] for p in parts
        )

    def estimates(self) -> torch.Tensor:
        return torch.stack([a.algorithm.estimate() for a in self.agents])


def assert_healthy(fleet: RejoinFleet) -> None:
    estimates = fleet.estimates()
    assert torch.isfinite(estimates).all()
    weights = [fleet.algorithm(i).y for i in range(fleet.n)]
    assert min(weights) > 1e-3, weights  # no weight drained away into a dead edge


def crash_and_account(fleet: RejoinFleet, victims: list[int], sources: list[Path | None]) -> None:
    """Restart ``victims``; the fleet's mass must change by exactly what they lost."""
    before_x, before_y = fleet.total()
    lost = [fleet.held(i) for i in victims]
    for i, source in zip(victims, sources, strict=True):
        fleet.restart(i, source)
    restored = [fleet.algorithm(i).mass() for i in victims]
    expected_x = before_x - sum(x for x, _ in lost) + sum(x for x, _ in restored)
    expected_y = before_y - sum(y for _, y in lost) + sum(y for _, y in restored)
    fleet.run(1)  # edges start over: senders re-send what was never acknowledged
    after_x, after_y = fleet.total()
    torch.testing.assert_close(after_x, expected_x, rtol=1e-12, atol=1e-12)
    assert after_y == pytest.approx(expected_y, rel=1e-12)


def test_an_agent_restarted_from_a_very_old_checkpoint_rejoins_safely(tmp_path: Path) -> None:
    fleet = RejoinFleet(tmp_path, 8, loss=0.2)
    fleet.run(10)
    old = fleet.keep_checkpoint(3, "old")  # round 10
    fleet.run(300)  # the fleet agrees long before this
    crash_and_account(fleet, [3], [old])
    fleet.run(300)
    assert_healthy(fleet)
    spread = fleet.estimates().max(0).values - fleet.estimates().min(0).values
    assert float(spread.abs().max()) < 1e-9  # the fleet agrees again, on its new average
    # and that average is the mass the fleet holds: nothing is stuck on an edge
    x, y = fleet.total()
    torch.testing.assert_close(fleet.estimates()[0], x / y, rtol=1e-9, atol=1e-12)


def test_an_agent_restarted_without_a_checkpoint_rejoins_safely(tmp_path: Path) -> None:
    fleet = RejoinFleet(tmp_path, 8, loss=0.2)
    fleet.run(40)
    crash_and_account(fleet, [5], [None])
    fleet.run(300)
    assert_healthy(fleet)
    spread = fleet.estimates().max(0).values - fleet.estimates().min(0).values
    assert float(spread.abs().max()) < 1e-9


def test_four_of_sixteen_restarted_at_once_from_checkpoints_of_every_age(tmp_path: Path) -> None:
    fleet = RejoinFleet(tmp_path, 16, loss=0.1)
    fleet.run(5)
    oldest = fleet.keep_checkpoint(1, "oldest")
    fleet.run(60)
    older = fleet.keep_checkpoint(6, "older")
    fleet.run(60)
    recent = fleet.keep_checkpoint(11, "recent")
    fleet.run(3)
    crash_and_account(fleet, [1, 6, 11, 14], [oldest, older, recent, None])
    fleet.run(400)
    assert_healthy(fleet)
    spread = fleet.estimates().max(0).values - fleet.estimates().min(0).values
    assert float(spread.abs().max()) < 1e-9


def test_a_restart_late_in_a_consensus_run_barely_moves_the_average(tmp_path: Path) -> None:
    """Once agents agree, what an agent gives and receives per round balance, so the mass
    its lost rounds held is close to what its checkpoint holds: the average moves little
    even with a checkpoint 200 rounds old (the figure docs/algorithms.md reports)."""
    fleet = RejoinFleet(tmp_path, 8, loss=0.1)
    fleet.run(100)
    old = fleet.keep_checkpoint(2, "old")
    fleet.run(200)
    x, y = fleet.total()
    before = x / y
    fleet.restart(2, old)
    fleet.run(300)
    after = fleet.estimates()[0]
    assert float((after - before).norm() / before.norm()) < 1e-3


def test_a_restarted_agent_skips_ahead_to_its_fleets_round(tmp_path: Path) -> None:
    fleet = RejoinFleet(tmp_path, 4, loss=0.0)
    fleet.run(30)
    old = fleet.keep_checkpoint(0, "old")
    fleet.run(100)
    assert fleet.restart(0, old) == 30
    agent = fleet.agents[0]
    runner = WallClockRunner(agent)
    runner.catch_up()  # nothing heard yet: decides later
    assert agent.round == 30
    agent.local_step(31)
    agent.push(31)  # its out-neighbours' acknowledgements name their round (130)
    runner.catch_up()
    assert agent.round == 129  # the next round it runs is the fleet's
    runner.catch_up()  # already there: no further jump
    assert agent.round == 129


def test_one_peer_cannot_pull_a_rejoining_agent_ahead(tmp_path: Path) -> None:
    fleet = RejoinFleet(tmp_path, 4, loss=0.0)
    fleet.run(5)
    agent = fleet.agents[0]
    agent._peer_rounds.update({"agent-1": 6, "agent-2": 5, "agent-3": 10**9})
    WallClockRunner(agent).catch_up()
    assert agent.round == 5


def test_an_agent_far_ahead_of_silent_in_neighbours_keeps_its_weight(tmp_path: Path) -> None:
    """An agent that runs round after round while its in-neighbours send nothing (they are
    restarting, or stalled) would give a share away every round and sink towards
    underflow; below a floor it keeps its share at home instead, and mass is conserved."""
    fleet = RejoinFleet(tmp_path, 4, loss=0.0)
    fleet.run(3)
    before_x, before_y = fleet.total()
    runner = fleet.agents[0]
    for r in range(4, 200):  # only agent-0 runs; the others absorb but never push
        runner.local_step(r)
        runner.push(r)
        runner.mix(r)
        for agent in fleet.agents[1:]:
            agent.mix(r)
    algorithm = fleet.algorithm(0)
    assert 1e-7 < algorithm.y < 1e-5  # sank to the floor and stayed there
    assert torch.isfinite(algorithm.estimate()).all()
    after_x, after_y = fleet.total()
    torch.testing.assert_close(after_x, before_x, rtol=1e-12, atol=1e-12)
    assert after_y == pytest.approx(before_y, rel=1e-12)


def test_an_agent_without_a_checkpoint_joins_late_with_a_small_weight(tmp_path: Path) -> None:
    """Its data went into the fleet before it lost its state: rejoining a fleet under way
    with the task's initial state at full weight would count that data twice (a converged
    consensus run then ends at relative error 0.8, benchmarks/rejoin). It joins with
    LATE_WEIGHT instead, and the average barely moves."""
    fleet = RejoinFleet(tmp_path, 8, loss=0.1)
    fleet.run(300)
    x, y = fleet.total()
    before = x / y
    fleet.restart(4, None)
    WallClockRunner(fleet.agents[4]).rejoin(fleet.round)
    assert fleet.algorithm(4).y == pytest.approx(LATE_WEIGHT)
    fleet.run(300)
    assert_healthy(fleet)
    after = fleet.estimates()[4]
    assert float((after - before).norm() / before.norm()) < 1e-3
    assert fleet.agents[4].round == fleet.round  # it runs in the fleet's rounds
