"""Private steps through Opacus: per-example gradients (``GradSampleModule``), clipping and
Gaussian noise (``DPOptimizer``), Poisson-sampled batches.

Every mechanism trains this way; they differ in the noise the optimizer adds (the whole of
it for DP-SGD, a share for the others) and in what is added after the step (the cancelling
masks). A step moves the model by ``-lr (sum of clipped gradients + noise) / E`` with
``E = sample_rate * nominal_examples`` the same on every agent, so that one example moves an
agent's model by at most ``lr * max_grad_norm / E`` whatever its shard's size.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from airgossip.edge.privacy.accounting import opacus_module
from airgossip.edge.tasks.base import PrivateTraining


@dataclass(frozen=True)
class StepResult:
    """The flat parameters after a round's private steps, and what the round cost."""

    parameters: torch.Tensor
    loss: float
    examples: int
    #: The step's scale ``lr / E``: a vector in gradient-sum units times this is a move of
    #: the model (the masks use it).
    scale: float


class PrivateTrainer:
    """Runs a task's private steps: Opacus's per-example gradients and DP optimizer.

    Parameters
    ----------
    mechanism:
        Its name (for errors).
    noise_multiplier:
        Gaussian noise the optimizer adds per step, over ``max_grad_norm``.
    max_grad_norm:
        Per-example clipping bound.
    sample_rate:
        Poisson sampling rate of each example per step.
    seed:
        Root of the batches' and the noise's draws (this agent's own).
    """

    def __init__(
        self,
        *,
        mechanism: str,
        noise_multiplier: float,
        max_grad_norm: float,
        sample_rate: float,
        seed: int,
    ) -> None:
        self.mechanism = mechanism
        self.noise_multiplier = noise_multiplier
        self.max_grad_norm = max_grad_norm
        self.sample_rate = sample_rate
        self._grad_sample = opacus_module("grad_sample", mechanism).GradSampleModule
        self._optimizers = opacus_module("optimizers", mechanism)
        self._batches = torch.Generator().manual_seed(seed)
        self._noise: torch.Generator | None = None
        self._noise_seed = seed ^ 0x5DEECE66D
        self._wrapped: tuple[nn.Module, Any] | None = None

    def _module(self, model: nn.Module) -> Any:
        """``model`` wrapped once for per-example gradients (the wrapper hooks its layers)."""
        if self._wrapped is None or self._wrapped[0] is not model:
            self._wrapped = (model, self._grad_sample(model, loss_reduction="sum"))
        return self._wrapped[1]

    def _noise_generator(self, device: torch.device) -> torch.Generator:
        if self._noise is None or self._noise.device != device:
            self._noise = torch.Generator(device=device).manual_seed(self._noise_seed)
        return self._noise

    def run(self, setup: PrivateTraining, steps: int) -> StepResult:
        """``steps`` private steps from the parameters ``setup.model`` holds."""
        model = setup.model
        module = self._module(model)
        params = [p for p in model.parameters() if p.requires_grad]
        expected = self.sample_rate * setup.nominal_examples
        device = params[0].device if params else torch.device("cpu")
        optimizer = self._optimizers.DPOptimizer(
            torch.optim.SGD(params, lr=setup.lr),
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            expected_batch_size=expected,
            loss_reduction="mean",
            generator=self._noise_generator(device),
        )
        count = len(setup.labels)
        total_loss, examples = 0.0, 0
        module.train()
        for _ in range(steps):
            chosen = torch.rand(count, generator=self._batches) < self.sample_rate
            batch = torch.nonzero(chosen).flatten().to(setup.features.device)
            optimizer.zero_grad(set_to_none=True)
            outputs = module(setup.features[batch])
            loss: Any = setup.loss(outputs, setup.labels[batch]).sum()
            with warnings.catch_warnings():
                # Opacus hooks every layer for per-example gradients; torch notes that the
                # first layer's inputs need none, on every step.
                warnings.filterwarnings("ignore", "Full backward hook", UserWarning)
                loss.backward()
            optimizer.step()
            total_loss += float(loss.detach())
            examples += len(batch)
        optimizer.zero_grad(set_to_none=True)
        flat = nn.utils.parameters_to_vector(model.parameters()).detach().cpu()
        return StepResult(
            parameters=flat,
            loss=total_loss / max(examples, 1),
            examples=examples,
            scale=setup.lr / expected,
        )
