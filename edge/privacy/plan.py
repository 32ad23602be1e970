"""What a run's noise is made of: the fleet's graph as the graph-aware mechanisms see it
(:class:`PrivacyGraph`), the noise each agent adds and what the accountant composes
(:class:`NoisePlan`, made by each mechanism's ``plan``), and network DP's pairwise figures.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from airgossip.common.topology import Graph, mixing_matrices
from airgossip.edge.privacy.accounting import gaussian_epsilon
from airgossip.edge.privacy.graph import NetworkSensitivities, network_sensitivities, pair_graph


@dataclass(frozen=True, eq=False)
class PrivacyGraph:
    """The fleet's graph as the graph-aware privacy mechanisms see it: its agents in index
    order, the first graph's links (``adjacency[i, j]``: ``i`` sends to ``j``, over every
    phase) and its mixing matrix (``mixing[j, i]``: the share of ``i``'s state that goes to
    ``j``). Not the coordinator's :class:`~airgossip.coordinator.graphs.FleetGraph` (a graph
    of agent ids it assigns)."""

    ids: tuple[str, ...]
    adjacency: np.ndarray
    mixing: np.ndarray
    #: False for graphs that change with time (switching, wireless, periodic phases).
    static: bool = True

    @classmethod
    def of(cls, graph: Graph, ids: tuple[str, ...], scheme: str, *, static: bool) -> PrivacyGraph:
        """The fleet's view of ``graph`` (its union of phases, its first phase's weights)."""
        return cls(ids, graph.union(), mixing_matrices(graph, scheme)[0],
                   static=static and graph.period == 1)  # fmt: skip

    def partners(self, identity: str) -> list[str]:
        """The agents ``identity`` shares a mask key with: either end of any of its links."""
        index = self.ids.index(identity)
        pairs = pair_graph(self.adjacency)
        return [self.ids[j] for j in np.flatnonzero(pairs[index])]

    @cached_property  # every agent of an in-process fleet holds the one graph
    def digest(self) -> str:
        """A fingerprint of all a noise plan can depend on here: the agents, the links,
        the weights and whether the graph changes."""
        h = hashlib.sha256("\0".join(self.ids).encode())
        h.update(np.ascontiguousarray(self.adjacency, dtype=bool).tobytes())
        h.update(np.ascontiguousarray(self.mixing, dtype=np.float64).tobytes())
        h.update(b"static" if self.static else b"changing")
        return h.hexdigest()[:32]


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

    noise_multiplier: float
    mask_multiplier: float = 0.0
    accounted_multiplier: float = 0.0
    network: NetworkSensitivities | None = None

    def pairwise_epsilon(self, rounds: int, delta: float) -> np.ndarray:
        """Network DP: ``epsilon[u, v]`` after ``rounds`` (NaN on the diagonal)."""
        if self.network is None:
            raise ValueError("pairwise epsilon is a figure of network DP")
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


def network_of(graph: PrivacyGraph, rounds: int) -> NetworkSensitivities:
    """Network DP's pairwise sensitivities on ``graph`` after each of ``rounds`` rounds
    (computed once per graph and length in a process)."""
    n = graph.mixing.shape[0]
    return _network(np.ascontiguousarray(graph.mixing, dtype=np.float64).tobytes(), n, rounds)


@lru_cache(maxsize=8)
def _network(mixing: bytes, n: int, rounds: int) -> NetworkSensitivities:
    w = np.frombuffer(mixing, dtype=np.float64).reshape(n, n)
    return network_sensitivities(w, rounds)
