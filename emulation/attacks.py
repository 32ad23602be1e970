"""Authenticated insiders on an in-process fleet: some agents send forged payloads.

An insider is an ordinary agent of the fleet (its own identity, the normal transport, its
honest algorithm's sequence numbers, acknowledgements and bookkeeping), except that every
payload it sends is rewritten just before it goes out: the vector says what the attack
wants the receiver to absorb. For algorithms that carry a weight (push-sum and the others
built on it) the forged running sum is ``y * v`` for the message's own weight ``y``, so
each increment the receiver absorbs has the estimate ``v``; for model-averaging algorithms
(D-PSGD, the clipped ones) the vector is the model ``v`` itself. Honest agents run the
chosen algorithm unchanged.

The insiders are omniscient, as in the papers' threat models: they read every honest
agent's current estimate and the graph.

Attacks (``v`` per receiver ``i``):

- ``huge``: ``1e6`` in every element.
- ``sign-flip``: minus the insider's own honest estimate.
- ``alie`` ("a little is enough", Baruch et al. 2019): the honest agents' element-wise
  mean minus ``ALIE_Z`` times their element-wise standard deviation.
- ``dissensus`` (Gaucher et al. 2025): ``z_i - eps * sum_k (z_k - z_i) / m_i`` over ``i``'s
  honest neighbours ``k``, ``m_i`` the insiders among its neighbours: it cancels ``eps``
  times the pull of ``i``'s honest neighbours (neighbours counted with equal weight).
- ``hub-dissensus`` (topology-aware): the dissensus values, sent from the agents of highest
  degree (the insiders are placed there instead of at the default places).
- ``slow-drift``: the receiver's own estimate plus ``DRIFT_STEP`` times its norm in one fixed
  direction (all elements equal), every round: each message is small (under the relative-
  increment floor of the alerts, inside the clipping radii), the sum over rounds is not.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
import torch

from airgossip.common.topology.graphs import Graph
from airgossip.common.topology.mixing import Phase
from airgossip.edge.agent import Agent
from airgossip.edge.algorithms import GossipAlgorithm, Payload
from airgossip.emulation.fleets import preflight
from airgossip.emulation.fleets.inproc import InProcessFleet
from airgossip.scenario.config import RunConfig

ATTACKS = ("huge", "sign-flip", "alie", "dissensus", "hub-dissensus", "slow-drift")
HUGE = 1e6
ALIE_Z = 1.0
DISSENSUS_EPS = 1.5
DRIFT_STEP = 0.1


@dataclass(frozen=True)
class Insiders:
    """Which agents lie and how: ``attack`` one of :data:`ATTACKS`, ``indices`` theirs."""

    attack: str
    indices: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.attack not in ATTACKS:
            raise ValueError(f"unknown attack '{self.attack}'; choose one of: {', '.join(ATTACKS)}")


def place_insiders(attack: str, count: int, graph: Graph, seed: int) -> Insiders:
    """``count`` insiders: at the highest-degree agents for ``hub-dissensus`` (ties to the
    lower index), elsewhere at agents drawn from ``seed``."""
    union = graph.union()
    n = graph.n
    if not 0 < count < n:
        raise ValueError(f"insiders must be between 1 and {n - 1}, got {count}")
    if attack == "hub-dissensus":
        degree = union.sum(axis=0) + union.sum(axis=1)
        order = sorted(range(n), key=lambda i: (-int(degree[i]), i))
        return Insiders(attack, tuple(sorted(order[:count])))
    rng = np.random.default_rng(seed)
    return Insiders(attack, tuple(sorted(int(i) for i in rng.choice(n, count, replace=False))))


class _Forger:
    """Rewrites one insider's payloads (see the module docstring)."""

    def __init__(self, insiders: Insiders, me: int, agents: list[Agent], graph: Graph) -> None:
        self.insiders = insiders
        self.me = me
        self.agents = agents
        self.graph = graph
        self.index = {a.agent_id: i for i, a in enumerate(agents)}
        self.honest = [i for i in range(len(agents)) if i not in insiders.indices]
        algorithm = agents[me].algorithm
        self.algorithm = algorithm
        self.honest_share: Callable[[Phase, Collection[str]], dict[str, Payload]] = algorithm.share

    def estimates(self) -> dict[int, torch.Tensor]:
        return {i: self.agents[i].algorithm.estimate() for i in self.honest}

    def target(self, peer: int, honest: dict[int, torch.Tensor]) -> torch.Tensor:
        attack = self.insiders.attack
        own = self.algorithm.estimate()
        if attack == "huge":
            return torch.full_like(own, HUGE)
        if attack == "sign-flip":
            return -own
        if attack == "alie":
            stacked = torch.stack(list(honest.values()))
            return stacked.mean(dim=0) - ALIE_Z * stacked.std(dim=0)
        receiver = honest.get(peer, own)
        if attack == "slow-drift":
            direction = torch.full_like(own, 1.0 / max(own.numel(), 1) ** 0.5)
            step: torch.Tensor = DRIFT_STEP * torch.linalg.vector_norm(receiver) * direction
            return receiver + step
        # dissensus: cancel (and reverse) the pull of the receiver's honest neighbours
        union = self.graph.union()
        neighbours = {int(k) for k in np.flatnonzero(union[:, peer] | union[peer, :])}
        liars = max(1, len(neighbours & set(self.insiders.indices)))
        pull = torch.zeros_like(own)
        for k in neighbours:
            if k in honest:
                pull += honest[k] - receiver
        return receiver - DISSENSUS_EPS * pull / liars

    def share(self, phase: Phase, ready: Collection[str]) -> dict[str, Payload]:
        payloads = self.honest_share(phase, ready)
        honest = self.estimates()
        forged = {}
        for peer, payload in payloads.items():
            v = self.target(self.index[peer], honest).to(payload.vector.dtype)
            y = payload.scalars.get("y")
            vector = v * y if y is not None else v
            encoded, decoded = self.algorithm.encode(vector.to(self.algorithm.dtype), peer)
            forged[peer] = Payload(
                decoded, dict(payload.scalars), payload.seq, payload.base_seq, encoded=encoded
            )
        return forged


def arm(insiders: Insiders, graph: Graph) -> Callable[[list[Agent]], None]:
    """A hook for :attr:`~airgossip.emulation.fleets.inproc.InProcessFleet.after_build` that turns
    the insiders' agents into forgers."""

    def hook(agents: list[Agent]) -> None:
        for i in insiders.indices:
            forger = _Forger(insiders, i, agents, graph)
            algorithm: GossipAlgorithm = agents[i].algorithm
            # The insider's own algorithm keeps every other duty (sequence numbers, acks).
            setattr(algorithm, "share", forger.share)  # noqa: B010

    return hook


def fleet_with_insiders(
    config: RunConfig, choose: Callable[[Graph], Insiders] | None
) -> tuple[InProcessFleet, tuple[int, ...]]:
    """An in-process fleet of ``config``, checked as every run is (its network built once),
    whose insiders (``choose`` picks them on the run's first graph) forge; and their indices."""
    network = preflight(config).network
    fleet = InProcessFleet(config, network)
    if choose is None:
        return fleet, ()
    insiders = choose(network.first_graph())
    fleet.after_build = arm(insiders, network.first_graph())
    return fleet, insiders.indices
