"""``separable``: logistic regression on linearly separable synthetic data, by gradient descent.

Taheri & Thrampoulidis (AISTATS 2023) show that decentralized gradient descent on separable
data generalizes like centralized gradient descent: the training loss of every agent's model
goes to zero at the centralized rate and the iterates turn towards the same max-margin
direction. This task is that setting: points ``x ~ N(0, I_dim)`` labelled by the sign of
``<w*, x>`` for a hidden unit vector ``w*``, points closer than ``margin`` to the separating
hyperplane redrawn, a homogeneous linear model ``w`` started at zero, and full-batch gradient
descent on the logistic loss of the agent's own shard (``local_steps`` steps a round).

Everything derives from the fleet seed, so any agent (or a check) can rebuild the pooled
training set and the test set: :meth:`SeparableTask.evaluate` reports the loss on the pooled
training set (the fleet's objective), and :func:`centralized_reference` runs centralized
gradient descent on the pooled data, the reference a check compares with at the same step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from airgossip.edge.tasks.base import EvalResult, TaskContext, TaskError, TrainConfig, TrainResult
from airgossip.edge.tasks.options import parse_options


class SeparableOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dim: int = Field(20, ge=1, le=10_000)
    samples_per_agent: int = Field(100, ge=1, le=1_000_000)
    test_samples: int = Field(2000, ge=1, le=10_000_000)
    margin: float = Field(0.1, ge=0, lt=1, description="least distance to the hyperplane")
    lr: float = Field(1.0, gt=0, description="gradient descent step")
    local_steps: int = Field(1, ge=1, description="gradient steps per round")


@dataclass(frozen=True)
class SeparableData:
    """The whole synthetic problem: every agent's shard, the pooled set and a test set."""

    direction: torch.Tensor  # w*, unit norm
    train_x: torch.Tensor  # (num_agents * samples_per_agent, dim), agent i's rows together
    train_y: torch.Tensor  # +-1
    test_x: torch.Tensor
    test_y: torch.Tensor
    samples_per_agent: int

    def shard(self, agent_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = slice(
            agent_index * self.samples_per_agent, (agent_index + 1) * self.samples_per_agent
        )
        return self.train_x[rows], self.train_y[rows]


def _points(
    rng: np.random.Generator, count: int, direction: np.ndarray, margin: float
) -> tuple[np.ndarray, np.ndarray]:
    chunks, kept = [], 0
    while kept < count:
        x = rng.standard_normal((max(2 * (count - kept), 16), direction.size))
        x = x[np.abs(x @ direction) >= margin]
        chunks.append(x)
        kept += len(x)
    x = np.concatenate(chunks)[:count]
    return x, np.sign(x @ direction)


def separable_data(seed: int, num_agents: int, options: SeparableOptions) -> SeparableData:
    """The problem of a fleet: the same on every agent for the same seed and fleet size."""
    if num_agents < 1:
        raise TaskError(f"task 'separable' needs at least one agent, got {num_agents}")
    rng = np.random.default_rng([seed, 20])
    direction = rng.standard_normal(options.dim)
    direction /= np.linalg.norm(direction)
    train_x, train_y = _points(
        rng, num_agents * options.samples_per_agent, direction, options.margin
    )
    test_x, test_y = _points(rng, options.test_samples, direction, options.margin)

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))

    return SeparableData(
        tensor(direction),
        tensor(train_x),
        tensor(train_y),
        tensor(test_x),
        tensor(test_y),
        options.samples_per_agent,
    )


def logistic_loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean ``log(1 + exp(-y <w, x>))``, computed without overflow."""
    return float(torch.nn.functional.softplus(-y * (x @ w)).mean())


def logistic_gradient(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Gradient of :func:`logistic_loss` at ``w``."""
    return -(x * (y * torch.sigmoid(-y * (x @ w)))[:, None]).mean(dim=0)


def misclassified(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of points on the wrong side of ``w`` (a point on the hyperplane is wrong)."""
    return float(((x @ w) * y <= 0).double().mean())


@dataclass(frozen=True)
class CentralizedRun:
    """Centralized gradient descent on the pooled training set, step by step.

    ``pooled_loss[t]`` and ``test_error[t]`` are the figures after ``t`` steps (``t = 0``:
    the zero start), so a decentralized run is compared at the same number of steps.
    """

    pooled_loss: np.ndarray
    test_error: np.ndarray
    parameters: torch.Tensor


def centralized_reference(
    seed: int, num_agents: int, options: SeparableOptions, steps: int
) -> CentralizedRun:
    """Gradient descent with the task's step size on the pooled data of the whole fleet."""
    data = separable_data(seed, num_agents, options)
    w = torch.zeros(options.dim, dtype=torch.float64)
    losses, errors = [], []
    for t in range(steps + 1):
        if t:
            w -= options.lr * logistic_gradient(w, data.train_x, data.train_y)
        losses.append(logistic_loss(w, data.train_x, data.train_y))
        errors.append(misclassified(w, data.test_x, data.test_y))
    return CentralizedRun(np.asarray(losses), np.asarray(errors), w)


class SeparableTask:
    """Decentralized gradient descent on this agent's shard of a separable problem."""

    name = "separable"
    shared_initialisation = True
    gossip_dtype = torch.float64

    def __init__(self, context: TaskContext) -> None:
        self.options = parse_options(SeparableOptions, context.options, self.name)
        self.data = separable_data(context.seed, context.num_agents, self.options)
        self._x, self._y = self.data.shard(context.agent_index)

    def initial_parameters(self) -> torch.Tensor:
        return torch.zeros(self.options.dim, dtype=torch.float32)

    def train(self, parameters: torch.Tensor, config: TrainConfig) -> TrainResult:
        w = parameters.detach().to(torch.float64).clone()
        for _ in range(self.options.local_steps):
            w -= self.options.lr * logistic_gradient(w, self._x, self._y)
        metrics = {"train_loss": logistic_loss(w, self._x, self._y), "lr": self.options.lr}
        return TrainResult(w.to(parameters.dtype), metrics, len(self._y) * self.options.local_steps)

    def evaluate(self, parameters: torch.Tensor) -> EvalResult:
        w = parameters.detach().to(torch.float64)
        data = self.data
        metrics = {
            "accuracy": 1.0 - misclassified(w, data.test_x, data.test_y),
            "loss": logistic_loss(w, data.test_x, data.test_y),
            "pooled_loss": logistic_loss(w, data.train_x, data.train_y),
        }
        return EvalResult(metrics, len(data.test_y))
