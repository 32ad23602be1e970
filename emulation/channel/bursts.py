"""Gilbert-Elliott bursty loss: a two-state Markov chain per link, vectorised over links."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GilbertElliottLoss:
    """Good/bad chain with a loss probability per state.

    Attributes
    ----------
    p:
        Probability per step of going from good to bad.
    r:
        Probability per step of going from bad to good (mean burst ``1 / r`` steps).
    loss_good, loss_bad:
        Loss probability in each state (``1 - k`` and ``1 - h`` in netem's ``gemodel``).
    """

    p: float
    r: float
    loss_good: float = 0.0
    loss_bad: float = 1.0

    def __post_init__(self) -> None:
        for name in ("p", "r", "loss_good", "loss_bad"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"Gilbert-Elliott {name} must be within [0, 1], got {value}")
        if self.p + self.r == 0:
            raise ValueError("Gilbert-Elliott p and r cannot both be 0")

    @property
    def bad_share(self) -> float:
        """Stationary share of steps in the bad state, ``p / (p + r)``."""
        return self.p / (self.p + self.r)

    @property
    def stationary_loss(self) -> float:
        return self.loss_good + (self.loss_bad - self.loss_good) * self.bad_share

    def initial(self, uniforms: np.ndarray) -> np.ndarray:
        """States drawn from the stationary distribution (True: bad)."""
        return np.asarray(uniforms) < self.bad_share

    def step(self, bad: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
        """Next states given the current ones and one uniform draw per link."""
        return np.where(bad, uniforms >= self.r, uniforms < self.p)

    def loss(self, bad: np.ndarray) -> np.ndarray:
        return np.where(bad, self.loss_bad, self.loss_good)
