"""Robust gossip on undirected graphs: each neighbour's pull clipped around the agent's own model.

Both algorithms are D-PSGD (:mod:`airgossip.edge.algorithms.dpsgd`: whole models to every neighbour,
symmetric Metropolis–Hastings weights, the latest model of a neighbour standing in for a
lost message) whose mix is

    x_i <- x_i + eta * sum_j W[i, j] * clip(x_j - x_i, tau_i)

with ``clip(v, tau) = v * min(1, tau / |v|)``. An insider among the neighbours then moves
the agent by at most ``eta * W[i, j] * tau_i`` a round however far its model is. With
``tau_i`` infinite it is D-PSGD itself. The radius needs symmetric weights (the analyses
do), so both refuse directed graphs, as D-PSGD does.

``byzantine`` is the most insiders an agent expects among its neighbours; their weight ``b``
is taken as the sum of the ``byzantine`` largest weights of the agent's neighbours.

Over the run, each neighbour's clipped pulls may add up to at most ``drift_budget`` times the
net pull of the ``byzantine + 1``-th largest other neighbour
(:class:`~airgossip.edge.algorithms.drift.DriftGuard`): a neighbour that stays inside the radius but
pulls the same way every round (a slow drift) is held there; what the budget cuts is not
applied (the neighbour's next model is compared afresh).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from airgossip.common.topology.graphs import Graph
from airgossip.common.topology.mixing import metropolis_hastings
from airgossip.edge.algorithms.clipping import (
    COUNTED_CLIP,
    clip_scale,
    cs_plus_never_mixes,
    cs_plus_radius,
    insider_weight,
    self_centred_radius,
)
from airgossip.edge.algorithms.dpsgd import DPSGD
from airgossip.edge.algorithms.drift import FLOOR, DriftGuard
from airgossip.edge.algorithms.state import AlgorithmState, state_table, state_value


class ClippedGossipOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tau: float | None = Field(
        None, gt=0, description="fixed clipping radius (default: the adaptive rule)"
    )
    byzantine: int = Field(1, ge=0, le=1000, description="most insiders among the neighbours")
    drift_budget: float | None = Field(
        4.0,
        gt=0,
        description="most net pull of one neighbour over the run, in multiples of the "
        "(byzantine+1)-th largest other neighbour's (none: unbounded)",
    )


class CSPlusOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    byzantine: int = Field(1, ge=0, le=1000, description="most insiders among the neighbours")
    drift_budget: float | None = Field(
        4.0,
        gt=0,
        description="most net pull of one neighbour over the run, in multiples of the "
        "(byzantine+1)-th largest other neighbour's (none: unbounded)",
    )
    step: float = Field(1.0, gt=0, le=1, description="eta: the communication step")


class _ClippedMix(DPSGD):
    """D-PSGD whose mix clips each neighbour's difference at :meth:`radius`."""

    #: The communication step ``eta`` (1: the D-PSGD weights themselves).
    step: float = 1.0

    last_radius: float = float("inf")

    #: The run's drift budget (None: none, as with ``byzantine`` 0).
    drift: DriftGuard | None = None

    #: Whether the radius falls to 0 once the nearest neighbours agree with the agent (the
    #: drift score then takes no evidence: see :meth:`mix`).
    frozen_when_agreed: ClassVar[bool] = False

    def _guard(self, budget: float | None, byzantine: int) -> None:
        if budget is not None and byzantine > 0:
            self.drift = DriftGuard(budget, byzantine)
        #: Drift score per neighbour (:attr:`DriftGuard.score`), read by the agent's observer.
        self.drift_by_sender: dict[str, float] = {} if self.drift is None else self.drift.score

    def state_dict(self) -> AlgorithmState:
        state = super().state_dict()
        if self.drift is not None:
            state["drift"] = state_value(self.drift.state_dict(), "drift")
        return state

    def load_state_dict(self, state: AlgorithmState) -> None:
        super().load_state_dict(state)
        if self.drift is not None and "drift" in state:
            drift: dict[str, object] = dict(state_table(state, "drift"))
            self.drift.load_state_dict(drift, self.dtype)

    def radius(self, distances: list[float], weights: list[float]) -> float:
        """The clipping radius of this round, given every neighbour's distance and weight."""
        raise NotImplementedError

    def mix(self) -> None:
        phase = self._phase
        if phase is None:
            return
        # A neighbour with nothing received yet stands at our own model (distance 0).
        diffs: dict[str, torch.Tensor] = {}
        for peer in phase.out_weights:
            latest = self._latest.get(peer)
            if latest is not None:
                diffs[peer] = latest[1] - self._x
        distances = {p: float(torch.linalg.vector_norm(d)) for p, d in diffs.items()}
        tau = self.radius(
            [distances.get(p, 0.0) for p in phase.out_weights], list(phase.out_weights.values())
        )
        self.last_radius = tau
        scales: dict[str, float] = {}
        # With a radius under the drift score's floor no neighbour moves the agent: a clip
        # then says nothing about the neighbour. cs-plus-gossip's radius is that of its
        # nearest neighbours: once they agree with the agent it takes in nothing from anyone,
        # and an honest fleet can freeze so, in clusters that never agree, whose frozen gaps
        # would score as a drift does; it takes no drift evidence from such rounds either.
        mixing = tau >= FLOOR * float(torch.linalg.vector_norm(self._x))
        for peer in diffs:
            scales[peer] = clip_scale(distances[peer], tau)
            if scales[peer] < COUNTED_CLIP and mixing:
                self.clipped_by_sender[peer] += 1
        if self.drift is not None:
            # What each neighbour's model proposes, before any cut: the drift score's evidence.
            if mixing or not self.frozen_when_agreed:
                self.drift.observe(diffs, float(torch.linalg.vector_norm(self._x)))
            pulls = {
                p: diffs[p] * (self.step * phase.out_weights[p] * scales[p])
                for p in diffs
                if scales[p] > 0
            }
            for peer, factor in self.drift.limit(pulls).items():
                scales[peer] *= factor
        mixed = self._x.clone()
        for peer, diff in diffs.items():
            mixed.add_(diff, alpha=self.step * phase.out_weights[peer] * scales[peer])
        self._x = mixed


class ClippedGossip(_ClippedMix):
    """Self-centred clipping (ClippedGossip; He, Karimireddy and Jaggi 2022) on undirected
    graphs. ``tau`` fixes the radius; without it, each round's radius is the paper's adaptive
    rule (:func:`~airgossip.edge.algorithms.clipping.self_centred_radius`) over the neighbours'
    current distances."""

    name = "clipped-gossip"
    options_model: ClassVar[type[BaseModel]] = ClippedGossipOptions

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        assert isinstance(self.options, ClippedGossipOptions)
        self._opts = self.options
        self._guard(self._opts.drift_budget, self._opts.byzantine)

    def radius(self, distances: list[float], weights: list[float]) -> float:
        if self._opts.tau is not None:
            return self._opts.tau
        insider = insider_weight(weights, self._opts.byzantine)
        return self_centred_radius(distances, weights, insider)


class CSPlusGossip(_ClippedMix):
    """CS+-RG (Gaucher et al., ICML 2025) on undirected graphs, the variant with the paper's
    adaptive radius: every round, each agent clips the neighbours that hold the ``2 b``
    farthest weight to the distance of the nearest of them
    (:func:`~airgossip.edge.algorithms.clipping.cs_plus_radius`) and takes a step ``eta`` (``step``)
    along the weighted sum of the clipped differences. With ``byzantine = 0`` it is D-PSGD
    (no clipping); ClippedGossip is the same step with He et al.'s radius."""

    name = "cs-plus-gossip"
    options_model: ClassVar[type[BaseModel]] = CSPlusOptions
    frozen_when_agreed: ClassVar[bool] = True

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        assert isinstance(self.options, CSPlusOptions)
        self._opts = self.options
        self.step = self._opts.step
        self._guard(self._opts.drift_budget, self._opts.byzantine)

    def radius(self, distances: list[float], weights: list[float]) -> float:
        insider = insider_weight(weights, self._opts.byzantine)
        return cs_plus_radius(distances, weights, insider)


def cs_plus_never_mixing(graph: Graph, byzantine: int) -> list[int]:
    """The nodes of undirected ``graph`` that CS+-RG with ``byzantine`` never lets mix: in
    every phase where they have neighbours, those neighbours' Metropolis–Hastings weight is
    too small beside twice the insiders' (:func:`cs_plus_never_mixes`), so the radius is 0
    whatever the models. Nodes without neighbours in any phase are not listed."""
    stranded = []
    matrices = [(a, metropolis_hastings(a)) for a in graph.phases]
    for i in range(graph.n):
        rows = [[float(w[i, j]) for j in np.flatnonzero(a[i])] for a, w in matrices]
        rows = [r for r in rows if r]
        if rows and all(cs_plus_never_mixes(r, byzantine) for r in rows):
            stranded.append(i)
    return stranded
