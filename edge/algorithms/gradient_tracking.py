"""Gradient tracking on directed graphs (Push-DIGing, Nedić, Olshevsky & Shi 2017).

With non-IID data every agent's gradient points somewhere else, and plain gossip SGD settles
where the local pulls balance, not at the minimiser of the average loss. Gradient tracking
gives every agent a second gossiped vector ``t`` that tracks the fleet's *average* update
direction, and each agent steps along ``t`` instead of its own gradient:

    t <- W t + h(k) - h(k-1)        x <- W (x - t)        z = x / y

with column-stochastic ``W`` and push-sum weights ``y``, so it runs on directed graphs.
Here ``h(k)`` is the task's local update direction at the de-biased estimate ``z`` (minus
what one round of local training moved ``z``), so the learning rate lives in the task.

The fleet's sum of ``t`` must equal the sum of the current ``h`` at all times; one lost
message would break that for ever. Both vectors therefore travel as push-sum running sums
(:class:`PushSum`, exact under loss, duplication and reordering): a message carries two
blocks, ``x`` and ``t``, each encoded on its own.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from airgossip.edge.algorithms.push_sum import PushSum
from airgossip.edge.algorithms.state import AlgorithmState, state_tensor


class GradientTracking(PushSum):
    """Push-DIGing: push-sum on ``[x, t]`` where ``t`` tracks the average update."""

    name = "gradient-tracking"
    several_mixes = False  # Push-DIGing's recursion: one mix per update
    max_blocks: ClassVar[int] = 2

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        n = self.numel
        # One mass vector [x, t]: push-sum splits and delivers both with the same weights.
        self._x = torch.cat([self._x, torch.zeros(n, dtype=self.dtype)])
        self._pending_x = torch.zeros_like(self._x)
        self._previous = torch.zeros(n, dtype=self.dtype)

    @property
    def x(self) -> torch.Tensor:
        return self._x[: self.numel]

    @property
    def tracker(self) -> torch.Tensor:
        """``t``: this agent's share of the tracked average update (mass units)."""
        return self._x[self.numel :]

    def estimate(self) -> torch.Tensor:
        return self._x[: self.numel] / self._y

    def apply_update(self, delta: torch.Tensor) -> None:
        direction = -delta.to(self.dtype)
        tracker = self._x[self.numel :]
        tracker.add_(direction).sub_(self._previous)
        self._previous = direction
        self._x[: self.numel].sub_(tracker)

    def state_dict(self) -> AlgorithmState:
        return {**super().state_dict(), "previous": self._previous.clone()}

    def load_state_dict(self, state: AlgorithmState) -> None:
        super().load_state_dict(state)
        self._previous = state_tensor(state, "previous").to(self.dtype).clone()

    def mass(self) -> tuple[torch.Tensor, float]:
        """``(x, y)`` held by this agent, unmixed mass included (``x`` without the tracker)."""
        x, y = super().mass()
        return x[: self.numel], y
