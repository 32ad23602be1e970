"""The Task contract: a model, its local data, training steps and evaluation.

A task sees parameters as one flat float32 CPU vector, in and out, much like a Flower
``ClientApp`` sees arrays + config in and arrays + metrics out; it moves them to its own
device to compute. The agent owns everything else (gossip state, transport, clocks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


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


class TaskError(ValueError):
    """A task that cannot be built (unknown name, bad options, import failure)."""


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
