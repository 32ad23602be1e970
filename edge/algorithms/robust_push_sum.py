"""Push-sum over directed, lossy graphs with each in-neighbour's influence bounded per round.

:class:`~airgossip.edge.algorithms.push_sum.PushSum` absorbs, per in-edge, the increment ``(dx,
dy)`` of the sender's running sum. An insider can make that increment anything finite. Here the
increments of a round are held per sender until the mix, and there each is cut down before it joins
the state:

1. **Weight.** At most ``weight_cap`` times the round's typical sender weight (the lower
   median of the senders' weights, and at most the agent's own weight ``y``) is absorbed
   from one sender in one round (the whole increment scaled down, so its estimate
   ``dx / dy`` is kept); the rest waits in that sender's *backlog*.
2. **Direction.** What is absorbed, ``(ax, ay)``, is split into the part that agrees with
   the agent's own estimate, ``ay * z``, and the deviation ``ax - ay * z``; the deviation is
   clipped to norm ``tau * ay`` and the cut-off part also waits in the backlog.
3. The backlog is offered again, with the sender's next increment, every round.

So one in-neighbour moves the agent's estimate ``z = x / y`` by at most
``tau * ay / (y + ay) <= tau * weight_cap / (1 + weight_cap)`` per round, whatever it sends,
and far less while the honest senders are the majority of those heard (its weight is then
held to ``weight_cap`` times theirs).

Nothing is thrown away while the backlog's deviation is within ``backlog_limit`` radii (a
running mean of the radii) per unit of the agent's weight: honest mass is only delayed, and
the fleet's sums of ``x`` and ``y`` are conserved as in push-sum once the backlogs drain
(they do as the agents agree and the deviations fall under the radius). What exceeds the
limit is dropped, counted in :attr:`RobustPushSum.dropped_mass`: that, and the delay, are
what robustness costs an honest fleet (figures in docs/algorithms.md).

``tau``: a fixed radius, or (default) each round's radius by ClippedGossip's adaptive rule
(:func:`~airgossip.edge.algorithms.clipping.self_centred_radius`) over the senders heard from this
round, each counted once (not by its increment's weight, which an insider can inflate), with
``byzantine`` the most insiders among an agent's in-neighbours. The radius follows the rule
up at once and down by at most ``radius_decay`` a round (the rule alone, on a sparse graph,
shrinks to the spread of the nearest senders and freezes an honest gap to the others); when
fewer than ``byzantine + 1`` senders were heard, the previous round's radius is kept.

4. **Drift.** Over the run, one sender's absorbed deviations may move the estimate by at most
   ``drift_budget`` times the net displacement of the ``byzantine + 1``-th largest of the
   other senders (:class:`~airgossip.edge.algorithms.drift.DriftGuard`): an insider that stays
   within the radius but pushes the same way round after round (a slow drift) is held at
   that budget; the cut part waits in its backlog like clipped mass.

What it does not bound: the fleet's total is no longer what the honest agents started with
once an insider's mass (within the budgets) is in it; an agent with one in-neighbour has no
other to set a drift budget by.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from airgossip.edge.algorithms.base import Ack, Payload
from airgossip.edge.algorithms.clipping import COUNTED_CLIP, clip_scale, self_centred_radius
from airgossip.edge.algorithms.drift import DriftGuard
from airgossip.edge.algorithms.push_sum import PushSum
from airgossip.edge.algorithms.state import (
    AlgorithmState,
    state_float,
    state_table,
    state_tensor,
    state_value,
)


class RobustPushSumOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tau: float | None = Field(
        None, gt=0, description="fixed clipping radius (default: the adaptive rule)"
    )
    byzantine: int = Field(1, ge=0, le=1000, description="most insiders among in-neighbours")
    weight_cap: float = Field(
        4.0, gt=0, le=1000, description="most weight absorbed from one sender per round, per own"
    )
    radius_decay: float = Field(
        0.95, ge=0, lt=1, description="how fast the adaptive radius may shrink per round"
    )
    backlog_limit: float = Field(
        16.0, gt=0, description="backlog kept, in radii of deviation per unit of own weight"
    )
    drift_budget: float | None = Field(
        4.0,
        gt=0,
        description="most net displacement of one sender over the run, in multiples of the "
        "(byzantine+1)-th largest other sender's (none: unbounded)",
    )


class RobustPushSum(PushSum):
    """Push-sum with per-sender increments clipped around the agent's own estimate (see the
    module docstring for what it bounds and what it costs)."""

    name = "robust-push-sum"
    several_mixes = False  # its screening's caps and budgets are per round
    options_model: ClassVar[type[BaseModel]] = RobustPushSumOptions

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        assert isinstance(self.options, RobustPushSumOptions)
        self._opts = self.options
        # Per sender: this round's increment plus what earlier rounds held back.
        self._held: dict[str, tuple[torch.Tensor, float]] = {}
        self.last_radius = 0.0 if self._opts.tau is None else self._opts.tau
        #: Norm of the ``x`` mass dropped past ``backlog_limit`` so far.
        self.dropped_mass = 0.0
        # A running mean of the radii: the backlog's limit when a round's radius is 0.
        self._radius_scale = 0.0
        budget = self._opts.drift_budget
        self.drift: DriftGuard | None = (
            DriftGuard(budget, self._opts.byzantine)
            if budget is not None and self._opts.byzantine > 0
            else None
        )
        #: Drift score per sender (:attr:`DriftGuard.score`), read by the agent's observer.
        self.drift_by_sender: dict[str, float] = {} if self.drift is None else self.drift.score

    def receive(self, sender: str, payload: Payload) -> Ack:
        # PushSum measures the increment into the pending sums: let it, from zero, and move
        # what it added into this sender's holding.
        saved_x, saved_y = self._pending_x, self._pending_y
        self._pending_x, self._pending_y = torch.zeros_like(self._x), 0.0
        try:
            ack = super().receive(sender, payload)
            increment_x, increment_y = self._pending_x, self._pending_y
        finally:
            self._pending_x, self._pending_y = saved_x, saved_y
        if increment_y != 0.0 or bool(increment_x.any()):
            held_x, held_y = self._held.get(sender, (torch.zeros_like(self._x), 0.0))
            self._held[sender] = (held_x + increment_x, held_y + increment_y)
        return ack

    def mass(self) -> tuple[torch.Tensor, float]:
        x, y = super().mass()
        for held_x, held_y in self._held.values():
            x, y = x + held_x, y + held_y
        return x, y

    def mix(self) -> None:
        own_y = self._y
        z = self._x / own_y
        # The cap follows the senders' typical weight (the lower median: one insider cannot
        # raise it) and never the agent's own weight, which an insider could inflate round
        # after round.
        weights = sorted(held_y for _, held_y in self._held.values() if held_y > 0)
        typical = weights[(len(weights) - 1) // 2] if weights else own_y
        cap = self._opts.weight_cap * min(own_y, typical)
        offers: dict[str, tuple[torch.Tensor, float]] = {}
        for sender, (held_x, held_y) in self._held.items():
            share = 1.0 if held_y <= cap else cap / held_y
            offers[sender] = (held_x * share, held_y * share)
        deviations = {s: ax - ay * z for s, (ax, ay) in offers.items()}
        norms = {s: float(torch.linalg.vector_norm(d)) for s, d in deviations.items()}
        distances = {
            s: (norms[s] / ay if ay > 0 else (0.0 if norms[s] == 0 else math.inf))
            for s, (_, ay) in offers.items()
        }
        # Only offers that carry weight speak for a sender (a backlog of rounding residue does not).
        tau = self._radius([distances[s] for s, (_, ay) in offers.items() if ay > 0])
        self.last_radius = tau
        if math.isfinite(tau) and tau > 0:
            self._radius_scale = 0.9 * self._radius_scale + 0.1 * tau
        scales: dict[str, float] = {}
        for sender, (_, ay) in offers.items():
            scale = clip_scale(distances[sender], tau) if ay > 0 else 0.0
            if scale < COUNTED_CLIP and norms[sender] > 0:
                self.clipped_by_sender[sender] += 1
            scales[sender] = scale
        if self.drift is not None:
            # What each sender's offer proposes, before any cut: the drift score's evidence.
            self.drift.observe(
                {s: deviations[s] / ay for s, (_, ay) in offers.items() if ay > 0},
                float(torch.linalg.vector_norm(z)),
            )
            # What each sender's clipped deviation adds to the estimate this mix.
            total_y = own_y + sum(ay for _, ay in offers.values())
            factors = self.drift.limit(
                {s: deviations[s] * (scales[s] / total_y) for s in offers if scales[s] > 0}
            )
            for sender, factor in factors.items():
                scales[sender] *= factor
        kept: dict[str, tuple[torch.Tensor, float]] = {}
        for sender, (_, ay) in offers.items():
            absorbed = ay * z + deviations[sender] * scales[sender]
            self._pending_x.add_(absorbed)
            self._pending_y += ay
            held_x, held_y = self._held[sender]
            rest_x, rest_y = held_x - absorbed, held_y - ay
            kept[sender] = self._bounded_backlog(rest_x, rest_y, z, tau, own_y)
        self._held = {s: m for s, m in kept.items() if m[1] != 0.0 or bool(m[0].any())}
        super().mix()

    def _radius(self, distances: list[float]) -> float:
        if self._opts.tau is not None:
            return self._opts.tau
        if len(distances) < self._opts.byzantine + 1:
            return self.last_radius
        # Every sender counts the same: weights are what an insider can inflate.
        weights = [1.0] * len(distances)
        rule = self_centred_radius(distances, weights, float(self._opts.byzantine))
        # The radius follows the rule up at once and down slowly: when the agents near us
        # agree, the rule alone shrinks to their spread and would freeze an honest gap to the
        # others (clusters that clip each other for ever).
        if not math.isfinite(self.last_radius):
            return rule
        return max(rule, self._opts.radius_decay * self.last_radius)

    def _bounded_backlog(
        self, x: torch.Tensor, y: float, z: torch.Tensor, tau: float, own_y: float
    ) -> tuple[torch.Tensor, float]:
        """The backlog ``(x, y)`` with its deviation from ``z`` cut to the limit; what is cut
        is dropped (and counted)."""
        scale = max(tau, self._radius_scale)
        if scale == 0.0 or not math.isfinite(scale):
            return x, y  # no scale known yet, or no clipping: the backlog is kept whole
        deviation = x - y * z
        norm = float(torch.linalg.vector_norm(deviation))
        limit = self._opts.backlog_limit * own_y * scale
        if norm <= limit:
            return x, y
        cut = deviation * (1.0 - limit / norm)
        self.dropped_mass += float(torch.linalg.vector_norm(cut))
        return x - cut, y

    def state_dict(self) -> AlgorithmState:
        state = super().state_dict()
        state["held"] = {s: (x.clone(), y) for s, (x, y) in self._held.items()}
        if self.drift is not None:
            state["drift"] = state_value(self.drift.state_dict(), "drift")
        return state

    def load_state_dict(self, state: AlgorithmState) -> None:
        super().load_state_dict(state)
        held: dict[str, tuple[torch.Tensor, float]] = {}
        for sender, part in state_table(state, "held").items():
            if not isinstance(part, list | tuple) or len(part) != 2:
                raise TypeError(f"'held.{sender}' is not an (x, y) pair")
            pair = {"x": part[0], "y": part[1]}
            held[sender] = (state_tensor(pair, "x").to(self.dtype).clone(), state_float(pair, "y"))
        self._held = held
        if self.drift is not None and "drift" in state:
            drift: dict[str, object] = dict(state_table(state, "drift"))
            self.drift.load_state_dict(drift, self.dtype)
