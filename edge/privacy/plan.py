"""From ``[privacy]`` and the fleet to noise: how much each agent adds, and what the
accountant composes. Resolved once per run, the same on every agent (every input is the
fleet's: settings, rounds, size, graph), so no agent needs to ask another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from edge.privacy.accounting import (
    PrivacyError,
    calibrate,
    gaussian_epsilon,
    opacus_noise_multiplier,
)
from edge.privacy.graph import (
    NetworkSensitivities,
    cancelling_noise_multiplier,
    network_sensitivities,
    pair_graph,
)
from edge.privacy.settings import PrivacySettings
from edge.topology import Graph, mixing_matrices

#: Mechanisms whose guarantee depends on the graph.
GRAPH_MECHANISMS = ("network-dp", "cancelling")


@dataclass(frozen=True, eq=False)
class FleetGraph:
    """What graph-aware mechanisms know of the fleet: its agents in index order, the first
    graph's links (``adjacency[i, j]``: ``i`` sends to ``j``, over every phase) and its
    mixing matrix (``mixing[j, i]``: the share of ``i``'s state that goes to ``j``)."""

    ids: tuple[str, ...]
    adjacency: np.ndarray
    mixing: np.ndarray
    #: False for graphs that change with time (switching, wireless, periodic phases).
    static: bool = True

    @classmethod
    def of(cls, graph: Graph, ids: tuple[str, ...], scheme: str, *, static: bool) -> FleetGraph:
        """The fleet's view of ``graph`` (its union of phases, its first phase's weights)."""
        return cls(ids, graph.union(), mixing_matrices(graph, scheme)[0],
                   static=static and graph.period == 1)  # fmt: skip

    def partners(self, identity: str) -> list[str]:
        """The agents ``identity`` shares a mask key with: either end of any of its links."""
        index = self.ids.index(identity)
        pairs = pair_graph(self.adjacency)
        return [self.ids[j] for j in np.flatnonzero(pairs[index])]


@dataclass(frozen=True, eq=False)
class NoisePlan:
    """The run's noise, per agent and step, and what the accountant composes.

    Attributes
    ----------
    noise_multiplier:
        What each agent's optimizer adds per step (over ``max_grad_norm``).
    mask_multiplier:
        Each pairwise mask (cancelling; 0 otherwise).
    accounted_multiplier:
        The Gaussian mechanism the per-step accountant composes: the agent's own noise
        (dp-sgd), the curator's (central), the worst agent's effective noise against
        ``[privacy] adversary`` (cancelling).
    network:
        Network DP's pairwise sensitivities (unit noise), round by round.
    """

    mechanism: str
    noise_multiplier: float
    mask_multiplier: float = 0.0
    accounted_multiplier: float = 0.0
    network: NetworkSensitivities | None = None

    def pairwise_epsilon(self, rounds: int, delta: float) -> np.ndarray:
        """Network DP: ``epsilon[u, v]`` after ``rounds`` (NaN on the diagonal)."""
        if self.network is None:
            raise ValueError("pairwise epsilon is a figure of network-dp")
        squared = self.network.at(rounds) / max(self.noise_multiplier, 1e-300) ** 2
        out = np.vectorize(lambda m: gaussian_epsilon(math.sqrt(m), delta))(squared)
        np.fill_diagonal(out, np.nan)
        return np.asarray(out, dtype=np.float64)


def mean_pair_epsilon(network: NetworkSensitivities, rounds: int, sigma: float,
                      delta: float) -> float:  # fmt: skip
    """The mean over ordered pairs of agents of network DP's epsilon after ``rounds``."""
    squared = network.at(rounds)
    off = squared[~np.eye(squared.shape[0], dtype=bool)] / sigma**2
    return float(np.mean([gaussian_epsilon(math.sqrt(m), delta) for m in off]))


@lru_cache(maxsize=8)
def _network(mixing: bytes, n: int, rounds: int) -> NetworkSensitivities:
    w = np.frombuffer(mixing, dtype=np.float64).reshape(n, n)
    return network_sensitivities(w, rounds)


def resolve_noise(
    settings: PrivacySettings, *, rounds: int, num_agents: int, graph: FleetGraph | None
) -> NoisePlan:
    """The run's :class:`NoisePlan` for ``rounds`` rounds (of which the private ones, every
    ``gossip_rounds``, are what the accountant composes); :class:`PrivacyError` when it cannot
    be made (a graph mechanism without the graph, a target no noise reaches)."""
    mech, q, delta = settings.mechanism, settings.sample_rate, settings.delta
    sigma, target = settings.noise_multiplier, settings.target_epsilon
    if mech in GRAPH_MECHANISMS and graph is None:
        raise PrivacyError(
            f"privacy mechanism '{mech}' depends on the fleet's graph, which this agent was "
            "not given (agents started by a run or by a coordinator's scenario know it)"
        )
    if mech == "dp-sgd":
        steps = settings.private_rounds(rounds) * settings.steps_per_round
        if sigma is None:
            assert target is not None
            sigma = opacus_noise_multiplier(target, delta, q, steps, settings.accountant, mech)
        return NoisePlan(mech, sigma, accounted_multiplier=sigma)
    if mech == "central":
        if sigma is None:
            assert target is not None
            steps = settings.private_rounds(rounds)
            sigma = opacus_noise_multiplier(target, delta, q, steps, settings.accountant, mech)
        return NoisePlan(mech, sigma / math.sqrt(num_agents), accounted_multiplier=sigma)
    assert graph is not None
    if mech == "cancelling":
        return _cancelling(settings, settings.private_rounds(rounds), graph)
    if mech == "network-dp":
        if not graph.static:
            raise PrivacyError(
                "privacy mechanism 'network-dp' is accounted for one fixed graph; this run's "
                "graph changes (use cancelling or dp-sgd, whose guarantees hold on any graph)"
            )
        n = graph.mixing.shape[0]
        network = _network(np.ascontiguousarray(graph.mixing, dtype=np.float64).tobytes(), n,
                           rounds)  # fmt: skip
        if sigma is None:
            assert target is not None
            sigma = calibrate(lambda s: mean_pair_epsilon(network, rounds, s, delta), target)
        return NoisePlan(mech, sigma, network=network)
    raise PrivacyError(f"unknown privacy mechanism '{mech}'")


@lru_cache(maxsize=8)
def _cancelling_unit(pairs: bytes, n: int, ratio: float, adversary: str) -> float:
    """The worst agent's effective multiplier against ``adversary`` with unit independent
    noise and masks ``ratio``."""
    matrix = np.frombuffer(pairs, dtype=bool).reshape(n, n)
    return cancelling_noise_multiplier(matrix, 1.0, ratio, adversary)


def _cancelling(settings: PrivacySettings, steps: int, graph: FleetGraph) -> NoisePlan:
    pairs = pair_graph(graph.adjacency)
    sigma, mask, adversary = settings.noise_multiplier, settings.mask_multiplier, settings.adversary

    def effective(s: float, m: float) -> float:
        return cancelling_noise_multiplier(pairs, s, m, adversary)

    ratio = settings.masks_over_noise
    if sigma is not None:
        mask = ratio * sigma if mask is None else mask
        return NoisePlan("cancelling", sigma, mask, effective(sigma, mask))
    assert settings.target_epsilon is not None
    wanted = opacus_noise_multiplier(
        settings.target_epsilon, settings.delta, settings.sample_rate, steps,
        settings.accountant, "cancelling",
    )  # fmt: skip
    if mask is None:
        # Effective noise is linear in a common scale of both: one evaluation suffices.
        unit = _cancelling_unit(pairs.tobytes(), pairs.shape[0], ratio, adversary)
        sigma = wanted / unit
        return NoisePlan("cancelling", sigma, ratio * sigma, wanted)
    fixed = mask
    sigma = calibrate(lambda s: 1.0 / effective(s, fixed), 1.0 / wanted)
    return NoisePlan("cancelling", sigma, fixed, effective(sigma, fixed))
