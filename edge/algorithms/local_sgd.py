"""Local SGD: ``H`` rounds of local training between two averaging rounds.

Periodic model averaging (MA-DNN; local SGD) cuts communication by ``H``: every agent trains
on its own for ``H - 1`` rounds, then gossips once. The averaging step is :class:`PushSum`
(exact under loss), so ``H = 1`` is plain gossip SGD (SGP) and, on the complete graph,
every ``H``-th round is an exact average as in periodic model averaging.

Silent rounds are a schedule, not a special case: :meth:`LocalSGD.schedule` hands the agent a
phase with no neighbours, so the agent neither sends nor waits for anyone in those rounds.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from edge.algorithms.base import Payload
from edge.algorithms.push_sum import PushSum
from edge.topology.mixing import Phase

#: The phase of a silent round: keep everything, talk to no one.
SILENT = Phase(1.0, {}, ())


class LocalSGDOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    period: int = Field(4, ge=1, le=100_000, description="H: rounds per averaging round")


class LocalSGD(PushSum):
    """Push-sum averaging every ``period`` rounds, local training in between."""

    name = "local-sgd"
    options_model = LocalSGDOptions

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        assert isinstance(self.options, LocalSGDOptions)
        self.period = self.options.period

    def schedule(self, round_index: int, phase: Phase) -> Phase:
        return phase if round_index % self.period == 0 else SILENT

    def share(self, phase: Phase, ready: Collection[str]) -> dict[str, Payload]:
        if phase is SILENT:
            return {}  # not even a retransmission: what is owed goes with the next average
        return super().share(phase, ready)
