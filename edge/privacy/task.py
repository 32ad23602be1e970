"""The seam between ``[privacy]`` and the agent: the agent's task, wrapped.

``build_agent`` wraps the task of an agent with a privacy mechanism in a
:class:`PrivateTask`: its ``train`` is the mechanism's (private steps, noise, masks) and its
``evaluate`` adds what the agent has spent (epsilon so far) to the figures the agent puts in
its round record. The agent itself knows nothing of privacy: it trains and evaluates its
task as always.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airgossip.edge.privacy.mechanism import PrivacyMechanism
from airgossip.edge.tasks.base import EvalResult, Task, TrainConfig, TrainResult


class PrivateTask:
    """``task`` trained by ``mechanism``.

    Parameters
    ----------
    task:
        The agent's task (everything but ``train`` and ``evaluate`` is its own).
    mechanism:
        The agent's privacy mechanism.
    weight:
        The agent's push-sum weight now (1 for algorithms without one): the one-step
        mechanisms add their step to push-sum's value as it is (see
        :meth:`~airgossip.edge.privacy.mechanism.PrivacyMechanism.train`).
    """

    def __init__(
        self, task: Task, mechanism: PrivacyMechanism, *, weight: Callable[[], float]
    ) -> None:
        self.task = task
        self.mechanism = mechanism
        self._weight = weight
        self.name = task.name
        self.shared_initialisation = task.shared_initialisation
        self.gossip_dtype = task.gossip_dtype

    def __getattr__(self, name: str) -> Any:
        # What else the task offers (distillation, its Flower client...) stays the task's.
        return getattr(self.task, name)

    def initial_parameters(self) -> torch.Tensor:
        return self.task.initial_parameters()

    def train(self, parameters: torch.Tensor, config: TrainConfig) -> TrainResult:
        """The mechanism's private round from ``parameters``."""
        return self.mechanism.train(parameters, config, weight=self._weight())

    def evaluate(self, parameters: torch.Tensor) -> EvalResult:
        """The task's evaluation, with what the agent has spent so far beside it."""
        result = self.task.evaluate(parameters)
        metrics = {**result.metrics, **self.mechanism.record_metrics()}
        return EvalResult(metrics, result.num_examples)
