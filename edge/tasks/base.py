"""The Task contract: a model, its local data, training steps and evaluation.

A task sees parameters as one flat float32 CPU vector, in and out, much like a Flower
``ClientApp`` sees arrays + config in and arrays + metrics out; it moves them to its own
device to compute. The agent owns everything else (gossip state, transport, clocks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from airgossip.edge.tasks.custom import TaskError as TaskError


@dataclass(frozen=True)
class TaskContext:
    """What a task is built from.

    Attributes
    ----------
    agent_index:
        This agent's index in the fleet (0-based); picks its data shard.
    num_agents:
        Fleet size (for partitioning data).
    seed:
        Fleet seed: the same on every agent, so shared-initialisation tasks start identical.
    device:
        Where the task computes (``cpu`` or ``cuda``).
    options:
        Task-specific options from the scenario's ``[task]`` table.
    """

    agent_index: int
    num_agents: int
    seed: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainConfig:
    round: int
    total_rounds: int


@dataclass(frozen=True)
class TrainResult:
    parameters: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    num_examples: int = 0


@dataclass(frozen=True)
class EvalResult:
    metrics: dict[str, float] = field(default_factory=dict)
    num_examples: int = 0


@runtime_checkable
class Task(Protocol):
    """A learning (or pure-gossip) workload run by one agent."""

    name: str
    #: True when every agent must start from the same parameters (all learning tasks).
    shared_initialisation: bool
    #: Precision of the gossip state the task needs (float64 for exact-average probes).
    gossip_dtype: torch.dtype
    # A task whose local step changes nothing (pure gossip) may also say ``trains = False``:
    # its agents then take one gossip step per round unless told otherwise (``mixing_steps``).

    def initial_parameters(self) -> torch.Tensor:
        """Flat CPU vector of initial parameters (float32 for models)."""
        ...

    def train(self, parameters: torch.Tensor, config: TrainConfig) -> TrainResult:
        """Run local steps from ``parameters``; return the new flat vector and metrics."""
        ...

    def evaluate(self, parameters: torch.Tensor) -> EvalResult:
        """Evaluate ``parameters``; ``metrics`` may hold ``accuracy`` and ``loss``."""
        ...


@runtime_checkable
class Distiller(Protocol):
    """A task that can compress an ensemble into its model (ensemble compression, EC-DNN)."""

    def distill(
        self, parameters: torch.Tensor, teachers: Sequence[torch.Tensor], config: TrainConfig
    ) -> TrainResult:
        """Train ``parameters`` on local data towards the averaged outputs of ``teachers``
        (flat parameter vectors of the same model); return the new flat vector."""
        ...


@dataclass(frozen=True)
class PrivateTraining:
    """What a privacy mechanism needs to train a task's model itself, one example at a time
    (per-example clipping): the model, already holding the parameters to start from, the
    agent's training examples, a per-example loss and this round's step size.

    Attributes
    ----------
    model:
        The task's model with the round's starting parameters loaded; trained in place.
    features, labels:
        The agent's training examples (first dimension: one per example).
    loss:
        ``loss(outputs, labels)`` -> one loss per example (no reduction).
    lr:
        Step size of this round.
    nominal_examples:
        A fleet-wide number of examples per agent (the same on every agent: the training
        set's size over the fleet's): steps divide by it times the sampling rate, so that
        every agent's update has the same scale.
    """

    model: nn.Module
    features: torch.Tensor
    labels: torch.Tensor
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    lr: float
    nominal_examples: float


@runtime_checkable
class SupportsPrivateTraining(Protocol):
    """A task whose training a privacy mechanism can run (``[privacy]``: dp-sgd and the
    other mechanisms clip every example's gradient, which needs the model and the data)."""

    def private_training(self, parameters: torch.Tensor, config: TrainConfig) -> PrivateTraining:
        """The model loaded with ``parameters``, the data and the loss for ``config``'s round."""
        ...


@torch.no_grad()
def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat vector into ``model``'s parameters (never aliasing the caller's tensor,
    unlike ``vector_to_parameters``)."""
    offset = 0
    for param in model.parameters():
        count = param.numel()
        param.copy_(flat[offset : offset + count].view_as(param))
        offset += count
    if offset != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} elements, the model {offset}")
