"""Ensemble compression (EC-DNN, Sun et al., ECML-PKDD 2017): combine models by their outputs.

Parameter averaging (MA-DNN, local SGD, every gossip algorithm here) needs models that start
from the same parameters: the average of independently initialised networks is a poor model
(their hidden units are permuted against each other). EC-DNN combines models the way an
ensemble does, by averaging their *outputs*, and then compresses the ensemble back into one
model of the same size by distillation on local data.

Here every ``period`` rounds an agent sends its whole model to its out-neighbours and keeps the
latest model from each in-neighbour. After that round's mix its *teachers* are its own model and
every in-neighbour's model received since the previous combination; the agent hands them to the
task's ``distill`` (:class:`~airgossip.edge.tasks.base.Distiller`), which trains the model on local
data towards the teachers' averaged outputs. The algorithm itself stays pure: parameters in, the
teachers out; the task does the learning. The fleet's models never become equal, so there is no
consensus to measure; what counts is each agent's accuracy.

Lost messages cost only ensemble members: a model that did not arrive is left out of that
combination (an old one is not reused). Directed graphs are fine.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from airgossip.common.topology.mixing import Phase
from airgossip.edge.algorithms.base import (
    Ack,
    GossipAlgorithm,
    InvalidPayload,
    ModelNumbers,
    Payload,
    check_absorption,
    check_sequence,
)
from airgossip.edge.algorithms.local_sgd import SILENT
from airgossip.edge.algorithms.state import (
    AlgorithmState,
    StateValue,
    state_flag,
    state_table,
    state_tensor,
)
from airgossip.edge.compression import Codec


class EnsembleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    period: int = Field(1, ge=1, le=100_000, description="rounds between two combinations")


class EnsembleCompression(GossipAlgorithm):
    """Whole models out every ``period`` rounds; the received ones are distilled into ours."""

    name = "ensemble"
    options_model: ClassVar[type[BaseModel]] = EnsembleOptions
    needs_distillation: ClassVar[bool] = True

    @classmethod
    def check_codec(cls, codec: Codec) -> None:
        if codec.sparsifier:
            raise ValueError(
                f"ensemble sends whole models to be run as teachers, and {codec.spec} would "
                "replace them by mostly zeros; use none, fp16, bf16 or qsgd"
            )

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        assert isinstance(self.options, EnsembleOptions)
        self.period = self.options.period
        self._x = initial.detach().to(device="cpu", dtype=self.dtype).clone()
        self._numbers = ModelNumbers()
        self._latest: dict[str, int] = {}  # sender -> seq of the model in `_fresh` or absorbed
        self._fresh: dict[str, torch.Tensor] = {}  # received since the last combination
        self._combining = False
        self._teachers: list[torch.Tensor] = []
        #: The members of the latest combination, own model first (for inspection).
        self.last_ensemble: list[torch.Tensor] = []

    def schedule(self, round_index: int, phase: Phase) -> Phase:
        return phase if round_index % self.period == 0 else SILENT

    def estimate(self) -> torch.Tensor:
        return self._x.clone()

    def apply_update(self, delta: torch.Tensor) -> None:
        self._x.add_(delta.to(self.dtype))

    def share(self, phase: Phase, ready: Collection[str]) -> dict[str, Payload]:
        if phase is SILENT:
            return {}
        self._combining = True
        payloads = {}
        for peer in phase.out_weights:
            if peer in ready:
                seq = self._numbers.next(peer)
                encoded, decoded = self.encode(self._x, peer)
                payloads[peer] = Payload(decoded, {}, seq, 0, encoded=encoded)
        return payloads

    def receive(self, sender: str, payload: Payload) -> Ack:
        if payload.vector.numel() != self.numel:
            raise InvalidPayload(f"ensemble message from '{sender}' is not one model")
        last = self._latest.get(sender)
        if last is not None and payload.seq <= last:
            return Ack(last, 0, absorbed=False)  # a duplicate or older model
        check_sequence(sender, payload.seq, last)
        model = payload.vector.to(self.dtype)
        check_absorption(model, 1.0, sender)  # a teacher the task will run: bounded
        self._latest[sender] = payload.seq
        self._fresh[sender] = model
        return Ack(payload.seq, 0, absorbed=True)

    def on_ack(self, peer: str, ack: Ack) -> None:
        self._numbers.on_ack(peer, ack.last_seq)

    def mix(self) -> None:
        if not self._combining:
            return  # models that arrive between combinations wait for the next one
        self._combining = False
        members = [self._x.clone(), *self._fresh.values()]
        self._fresh.clear()
        self.last_ensemble = members
        self._teachers = members if len(members) > 1 else []

    def teachers(self) -> list[torch.Tensor]:
        teachers, self._teachers = self._teachers, []
        return teachers

    def scalars(self) -> dict[str, float]:
        return {"ensemble_size": float(len(self.last_ensemble))}

    def forget_in_edge(self, sender: str) -> None:
        self._latest.pop(sender, None)

    def state_dict(self) -> AlgorithmState:
        fresh: dict[str, StateValue] = dict(self._fresh)
        return {
            **super().state_dict(),
            "x": self._x.clone(), "fresh": fresh, "combining": self._combining,
        }  # fmt: skip

    def load_state_dict(self, state: AlgorithmState) -> None:
        super().load_state_dict(state)
        self._x = state_tensor(state, "x").to(self.dtype).clone()
        fresh = state_table(state, "fresh")
        self._fresh = {p: state_tensor(fresh, p).to(self.dtype) for p in fresh}
        self._combining = state_flag(state, "combining")
