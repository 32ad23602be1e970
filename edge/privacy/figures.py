"""An agent's privacy figures and their names in round records (no heavy imports: metrics,
results and the coordinator read them)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

#: Metric names of :class:`Spent` in a round record (and a round report).
EPSILON = "privacy_epsilon"
EPSILON_MEAN = "privacy_epsilon_mean"
STEPS = "privacy_steps"
EXHAUSTED = "privacy_exhausted"


@dataclass(frozen=True)
class Spent:
    """What an agent has spent after a round.

    Attributes
    ----------
    epsilon:
        Epsilon so far at the run's delta (network DP: towards the curious agent that learns
        most about this one).
    steps:
        Private steps (rounds, for the one-step mechanisms) accounted.
    epsilon_mean:
        Network DP: the mean over the other agents.
    exhausted:
        The budget stopped the agent's training.
    """

    epsilon: float
    steps: int
    epsilon_mean: float | None = None
    exhausted: bool = False

    def as_metrics(self) -> dict[str, float]:
        """The numbers a round record carries. An unbounded epsilon (no noise) is left out:
        round reports carry finite figures only (the coordinator refuses others)."""
        out = {STEPS: float(self.steps), EXHAUSTED: float(self.exhausted)}
        if math.isfinite(self.epsilon):
            out[EPSILON] = self.epsilon
        if self.epsilon_mean is not None and math.isfinite(self.epsilon_mean):
            out[EPSILON_MEAN] = self.epsilon_mean
        return out

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, float]) -> Spent | None:
        """The inverse of :meth:`as_metrics` (None for a record without privacy figures)."""
        if STEPS not in metrics:
            return None
        return cls(
            epsilon=float(metrics.get(EPSILON, math.inf)),
            steps=int(metrics.get(STEPS, 0)),
            epsilon_mean=metrics.get(EPSILON_MEAN),
            exhausted=bool(metrics.get(EXHAUSTED, 0.0)),
        )
