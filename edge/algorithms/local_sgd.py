"""Local SGD: local training between averaging rounds, optionally with an outer optimizer.

Periodic model averaging (MA-DNN; local SGD) cuts communication by ``H``: every agent trains
on its own for ``H - 1`` rounds, then gossips once. The averaging step is :class:`PushSum`
(exact under loss), so ``H = 1`` is plain gossip SGD (SGP) and, on the complete graph,
every ``H``-th round is an exact average as in periodic model averaging.

**Outer optimizer (DiLoCo, Douillard et al. 2023; PALSGD, Naganuma et al. 2025).** With
``outer_lr`` or ``outer_momentum`` set, an averaging round does not simply adopt the average:
the *pseudo-gradient* ``g = anchor - z`` (the model before this period's local steps minus
the average after them) drives an outer step with Nesterov momentum,
``v <- mu v + g``, ``anchor <- anchor - outer_lr (g + mu v)`` (``anchor - outer_lr v``
without Nesterov), and the agent continues from the new anchor. ``outer_lr = 1`` with no
momentum is plain averaging, bit for bit. Each agent keeps its own anchor and momentum; on an
exact average (complete graph, no loss) they are the same on every agent.

**Pseudo-synchronous averaging.** With ``probability`` the fleet averages in each round with
that probability instead of every ``period`` rounds (``1 / probability`` rounds apart on
average). The draws come from ``schedule_seed`` and the round alone, so every agent draws the
same rounds and they average together.

Silent rounds are a schedule, not a special case: :meth:`LocalSGD.schedule` hands the agent a
phase with no neighbours, so the agent neither sends nor waits for anyone in those rounds.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from airgossip.common.seeds import derive_seed
from airgossip.common.topology.mixing import Phase
from airgossip.edge.algorithms.base import Payload
from airgossip.edge.algorithms.push_sum import PushSum
from airgossip.edge.algorithms.state import AlgorithmState, state_flag, state_int, state_tensor

#: The phase of a silent round: keep everything, talk to no one.
SILENT = Phase(1.0, {}, ())


class LocalSGDOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    period: int = Field(4, ge=1, le=100_000, description="H: rounds per averaging round")
    probability: float | None = Field(
        None, gt=0, le=1, description="average in each round with this probability instead"
    )
    schedule_seed: int = Field(0, ge=0, description="seed of the averaging draws")
    outer_lr: float = Field(1.0, gt=0, le=10, description="outer learning rate")
    outer_momentum: float = Field(0.0, ge=0, lt=1, description="outer momentum")
    nesterov: bool = Field(True, description="Nesterov form of the outer momentum")

    @model_validator(mode="after")
    def _one_schedule(self) -> LocalSGDOptions:
        if self.probability is not None and "period" in self.model_fields_set:
            raise ValueError(
                "give period (average every H rounds) or probability (average with this "
                "probability each round), not both"
            )
        return self

    def averages(self, round_index: int) -> bool:
        """Whether round ``round_index`` is an averaging round (the same on every agent)."""
        if self.probability is None:
            return round_index % self.period == 0
        draw = random.Random(derive_seed(self.schedule_seed, "local-sgd", round_index)).random()
        return draw < self.probability


class LocalSGD(PushSum):
    """Push-sum averaging now and then, local training in between, an optional outer step."""

    name = "local-sgd"
    several_mixes = False  # an averaging round mixes once, then takes its outer step
    options_model = LocalSGDOptions

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        assert isinstance(self.options, LocalSGDOptions)
        self.local_options = self.options
        self.period = self.options.period
        #: Averaging rounds this agent took part in.
        self.averaging_rounds = 0
        self._outer = self.options.outer_lr != 1.0 or self.options.outer_momentum > 0
        self._anchor = self.estimate()
        self._velocity = torch.zeros_like(self._anchor)
        self._averaged = False
        self._decided: tuple[int, bool] = (-1, False)

    def schedule(self, round_index: int, phase: Phase) -> Phase:
        if self._decided[0] != round_index:  # asked more than once per round: draw once
            self._decided = (round_index, self.local_options.averages(round_index))
        return phase if self._decided[1] else SILENT

    def share(self, phase: Phase, ready: Collection[str]) -> dict[str, Payload]:
        if phase is SILENT:
            return {}  # not even a retransmission: what is owed goes with the next average
        self._averaged = True
        self.averaging_rounds += 1
        return super().share(phase, ready)

    def mix(self) -> None:
        super().mix()
        if self._averaged:
            self._averaged = False
            if self._outer:
                self._outer_step()

    def state_dict(self) -> AlgorithmState:
        return {
            **super().state_dict(),
            "averaging_rounds": self.averaging_rounds, "anchor": self._anchor.clone(),
            "velocity": self._velocity.clone(), "averaged": self._averaged,
        }  # fmt: skip

    def load_state_dict(self, state: AlgorithmState) -> None:
        super().load_state_dict(state)
        self.averaging_rounds = state_int(state, "averaging_rounds")
        self._anchor = state_tensor(state, "anchor").to(self.dtype).clone()
        self._velocity = state_tensor(state, "velocity").to(self.dtype).clone()
        self._averaged = state_flag(state, "averaged")

    def _outer_step(self) -> None:
        options = self.local_options
        z = self.estimate()
        pseudo_gradient = self._anchor - z
        momentum = options.outer_momentum
        self._velocity.mul_(momentum).add_(pseudo_gradient)
        step = (
            pseudo_gradient.add(self._velocity, alpha=momentum)
            if options.nesterov
            else self._velocity
        )
        anchor = self._anchor - options.outer_lr * step
        self.apply_update(anchor - z)  # the agent continues from the new anchor
        self._anchor = anchor
