"""A user task: least-squares linear regression on synthetic data, one shard per agent.

Run it with ``airgossip run --task examples.linear_task:make_task`` from the repository root (or any
importable ``module:callable``). The callable gets an :class:`airgossip.edge.tasks.TaskContext` and
returns an object with ``initial_parameters``, ``train`` and ``evaluate``; torch's global RNG is
already seeded with the fleet seed, so a model built the ordinary way starts identical on every
agent.
"""

from __future__ import annotations

import torch
from torch import nn

from airgossip.edge.tasks import EvalResult, TaskContext, TrainConfig, TrainResult
from airgossip.edge.tasks.base import load_flat


class LinearTask:
    name = "linear"
    shared_initialisation = True
    gossip_dtype = torch.float32

    def __init__(self, context: TaskContext) -> None:
        features = int(context.options.get("features", 5))
        self.lr = float(context.options.get("lr", 0.05))
        truth = torch.Generator().manual_seed(context.seed)
        self.weights = torch.randn(features, 1, generator=truth)
        data = torch.Generator().manual_seed(context.seed * 7919 + context.agent_index + 1)
        self.x = torch.randn(64, features, generator=data)
        self.y = self.x @ self.weights + 0.01 * torch.randn(64, 1, generator=data)
        self.model = nn.Linear(features, 1)

    def initial_parameters(self) -> torch.Tensor:
        return nn.utils.parameters_to_vector(self.model.parameters()).detach().clone()

    def train(self, parameters: torch.Tensor, config: TrainConfig) -> TrainResult:
        load_flat(self.model, parameters)
        loss = nn.functional.mse_loss(self.model(self.x), self.y)
        grads = torch.autograd.grad(loss, list(self.model.parameters()))
        with torch.no_grad():
            for p, g in zip(self.model.parameters(), grads, strict=True):
                p.sub_(self.lr * g)
        new = nn.utils.parameters_to_vector(self.model.parameters()).detach().clone()
        return TrainResult(new, {"train_loss": float(loss.detach())}, len(self.x))

    @torch.no_grad()
    def evaluate(self, parameters: torch.Tensor) -> EvalResult:
        load_flat(self.model, parameters)
        return EvalResult({"loss": float(nn.functional.mse_loss(self.model(self.x), self.y))})


def make_task(context: TaskContext) -> LinearTask:
    return LinearTask(context)
