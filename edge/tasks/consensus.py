"""``consensus``: each agent holds a random vector; the goal is their exact average.

No learning at all: the pure-gossip probe of an algorithm's correctness. Vectors are drawn
from ``(seed, agent_index)`` so anyone can recompute the true average independently.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from airgossip.edge.tasks.base import EvalResult, TaskContext, TrainConfig, TrainResult
from airgossip.edge.tasks.options import parse_options


class ConsensusOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dim: int = Field(100, ge=1, le=100_000_000)
    offset: float = Field(1.0, description="mean of every entry, so the average is not ~0")


def consensus_vector(seed: int, agent_index: int, options: ConsensusOptions) -> torch.Tensor:
    """The float64 vector agent ``agent_index`` starts from."""
    rng = np.random.default_rng([seed, agent_index])
    return torch.from_numpy(rng.standard_normal(options.dim) + options.offset)


def true_average(seed: int, num_agents: int, options: ConsensusOptions) -> torch.Tensor:
    """The exact average every agent should converge to (float64)."""
    total = torch.zeros(options.dim, dtype=torch.float64)
    for index in range(num_agents):
        total += consensus_vector(seed, index, options)
    return total / num_agents


class ConsensusTask:
    """Average vectors by gossip alone; ``train`` leaves parameters unchanged."""

    name = "consensus"
    shared_initialisation = False
    gossip_dtype = torch.float64
    #: Its local step changes nothing: a round is already one pure gossip step.
    trains = False

    def __init__(self, context: TaskContext) -> None:
        self.options = parse_options(ConsensusOptions, context.options, self.name)
        self._initial = consensus_vector(context.seed, context.agent_index, self.options)

    def initial_parameters(self) -> torch.Tensor:
        return self._initial.clone()

    def train(self, parameters: torch.Tensor, config: TrainConfig) -> TrainResult:
        return TrainResult(parameters)

    def evaluate(self, parameters: torch.Tensor) -> EvalResult:
        return EvalResult()
