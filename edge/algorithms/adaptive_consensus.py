"""DSGD-AC: D-PSGD with a consensus step that changes over the run (controlled disagreement).

Wang & Johansson (arXiv 2602.02899, 2026) keep the replicas of decentralized SGD apart on
purpose: their consensus errors act as structured perturbations that lead to flatter minima.
The update is D-PSGD's with a consensus step ``gamma_t``::

    x_i <- x_i + gamma_t (sum_j W[i, j] x_j - x_i)        (then the local step)

``gamma_t = 1`` is D-PSGD. Two schedules (``shape``):

- ``learning-rate`` (the default, DSGD-AC's): ``gamma_max`` for the first ``warmup_rounds``,
  then ``gamma_min + (gamma_max - gamma_min) * (lr_t / lr_max) ** power``, where ``lr_t`` is
  the learning rate the task reports for the round (train metric ``lr``) and ``lr_max`` the
  largest it has reported. As the learning rate decays, so does the consensus step, so the
  disagreement, which D-PSGD shrinks in proportion to the learning rate, does not vanish.
  The form, the defaults (``power`` 3, ``gamma`` from 1 to 0) and the mix as
  ``lerp(x, W x, gamma)`` are those of the first author's public simulator
  (``WangZesen/Distributed-Simulator``, ``_mixing_gamma``); the paper's own text was not
  available to check against (see docs/algorithms.md).
- ``ramp``: ``gamma`` rises linearly from ``gamma_min`` to ``gamma_max`` over the first
  ``ramp_rounds`` rounds and stays there: replicas apart early, together late.

The weights and the handling of lost messages are D-PSGD's
(:class:`~airgossip.edge.algorithms.dpsgd.DPSGD`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from airgossip.edge.algorithms.dpsgd import DPSGD
from airgossip.edge.algorithms.state import AlgorithmState, state_float


class AdaptiveConsensusOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: Literal["learning-rate", "ramp"] = Field(
        "learning-rate", description="gamma follows the learning rate, or ramps up over rounds"
    )
    gamma_max: float = Field(1.0, gt=0, le=1, description="largest consensus step")
    gamma_min: float = Field(0.0, ge=0, le=1, description="smallest consensus step")
    power: float = Field(3.0, gt=0, le=100, description="learning-rate shape: exponent")
    warmup_rounds: int = Field(0, ge=0, description="learning-rate shape: rounds at gamma_max")
    ramp_rounds: int | None = Field(None, ge=1, description="ramp shape: rounds to gamma_max")

    @model_validator(mode="after")
    def _consistent(self) -> AdaptiveConsensusOptions:
        if self.gamma_min > self.gamma_max:
            raise ValueError(
                f"gamma_min ({self.gamma_min}) must not exceed gamma_max ({self.gamma_max})"
            )
        if self.shape == "ramp" and self.ramp_rounds is None:
            raise ValueError("shape 'ramp' needs ramp_rounds (rounds from gamma_min to gamma_max)")
        if self.shape == "learning-rate" and self.ramp_rounds is not None:
            raise ValueError("ramp_rounds belongs to shape 'ramp'; shape is 'learning-rate'")
        return self


def consensus_step(options: AdaptiveConsensusOptions, round_index: int, lr_ratio: float) -> float:
    """``gamma`` of round ``round_index`` (from 1); ``lr_ratio`` is ``lr_t / lr_max``."""
    low, high = options.gamma_min, options.gamma_max
    if options.shape == "ramp":
        assert options.ramp_rounds is not None
        return low + (high - low) * min(1.0, round_index / options.ramp_rounds)
    if round_index <= options.warmup_rounds:
        return high
    ratio = min(1.0, max(0.0, float(lr_ratio)))
    return float(low + (high - low) * ratio**options.power)


class AdaptiveConsensusDPSGD(DPSGD):
    """D-PSGD whose consensus step follows a schedule (DSGD-AC); see the module docstring."""

    name = "dpsgd-ac"
    options_model = AdaptiveConsensusOptions

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        assert isinstance(self.options, AdaptiveConsensusOptions)
        self.schedule_options = self.options
        self.gamma = self.options.gamma_max
        self._lr_max = 0.0

    def on_local_step(self, round_index: int, metrics: Mapping[str, float]) -> None:
        options = self.schedule_options
        ratio = 1.0
        if options.shape == "learning-rate":
            lr = metrics.get("lr")
            if lr is None or not math.isfinite(lr) or lr < 0:
                raise ValueError(
                    "dpsgd-ac with shape 'learning-rate' needs the task to report its learning "
                    f"rate as the train metric 'lr' (digits and separable do), got {lr!r}; "
                    "use shape 'ramp' otherwise"
                )
            self._lr_max = max(self._lr_max, lr)
            ratio = lr / self._lr_max if self._lr_max > 0 else 1.0
        self.gamma = consensus_step(options, round_index, ratio)

    def mix(self) -> None:
        before = self._x
        super().mix()
        if self.gamma != 1.0 and self._x is not before:
            self._x = torch.lerp(before, self._x, self.gamma)

    def scalars(self) -> dict[str, float]:
        return {"gamma": self.gamma}

    def state_dict(self) -> AlgorithmState:
        return {**super().state_dict(), "gamma": self.gamma, "lr_max": self._lr_max}

    def load_state_dict(self, state: AlgorithmState) -> None:
        super().load_state_dict(state)
        self.gamma = state_float(state, "gamma")
        self._lr_max = state_float(state, "lr_max")
