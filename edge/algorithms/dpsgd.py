"""D-PSGD (Lian et al. 2017): decentralized parallel SGD on undirected graphs.

Every agent sends its whole model to its neighbours and replaces its own by the weighted
average ``x_i <- sum_j W[i, j] x_j`` with doubly stochastic Metropolis–Hastings weights
``W[i, j] = 1 / (1 + max(d_i, d_j))``, so the fleet's average is preserved without any
push-sum weight. The weights need symmetric links: the algorithm refuses directed graphs.

Under message loss the average is *not* preserved: an agent whose neighbour's model did not
arrive this round uses the last one it received from that neighbour (or its own, before the
first), so the fleet still reaches consensus, but near the average rather than on it. That is
the textbook algorithm's behaviour; ``push-sum`` is the exact alternative.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

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
from airgossip.edge.algorithms.state import AlgorithmState, state_tensor
from airgossip.edge.compression import Codec


class DPSGD(GossipAlgorithm):
    """Model averaging with doubly stochastic weights; stale neighbours' models stand in for
    lost messages."""

    name = "dpsgd"
    mixing = "metropolis-hastings"

    @classmethod
    def check_codec(cls, codec: Codec) -> None:
        if codec.sparsifier:
            raise ValueError(
                f"dpsgd sends whole models, so {codec.spec} would replace neighbours' models by "
                "mostly zeros; use choco (error feedback) with sparsifiers"
            )

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        self._x = initial.detach().to(device="cpu", dtype=self.dtype).clone()
        self._latest: dict[str, tuple[int, torch.Tensor]] = {}
        self._numbers = ModelNumbers()
        self._phase: Phase | None = None

    @property
    def x(self) -> torch.Tensor:
        return self._x

    def estimate(self) -> torch.Tensor:
        return self._x.clone()

    def apply_update(self, delta: torch.Tensor) -> None:
        self._x.add_(delta.to(self.dtype))

    def share(self, phase: Phase, ready: Collection[str]) -> dict[str, Payload]:
        self._phase = phase
        payloads = {}
        for peer in phase.out_weights:
            if peer in ready:
                seq = self._numbers.next(peer)
                encoded, decoded = self.encode(self._x, peer)
                payloads[peer] = Payload(decoded, {}, seq, 0, encoded=encoded)
        return payloads

    def on_ack(self, peer: str, ack: Ack) -> None:
        self._numbers.on_ack(peer, ack.last_seq)

    def receive(self, sender: str, payload: Payload) -> Ack:
        if payload.vector.numel() != self.numel:
            raise InvalidPayload(f"dpsgd message from '{sender}' is not one model")
        last = self._latest.get(sender)
        if last is not None and payload.seq <= last[0]:
            return Ack(last[0], 0, absorbed=False)  # older than what we hold
        check_sequence(sender, payload.seq, last[0] if last is not None else None)
        model = payload.vector.to(self.dtype)
        check_absorption(model, 1.0, sender)  # the mix averages models: each must be bounded
        self._latest[sender] = (payload.seq, model)
        return Ack(payload.seq, 0, absorbed=True)

    def forget_in_edge(self, sender: str) -> None:
        latest = self._latest.get(sender)
        if latest is not None:  # its model still stands in until a newer one arrives
            self._latest[sender] = (0, latest[1])

    def state_dict(self) -> AlgorithmState:
        return {**super().state_dict(), "x": self._x.clone()}

    def load_state_dict(self, state: AlgorithmState) -> None:
        super().load_state_dict(state)
        self._x = state_tensor(state, "x").to(self.dtype).clone()

    def mix(self) -> None:
        phase = self._phase
        if phase is None:
            return
        # Symmetric weights: W[i, j] = W[j, i], our own out-weight to j.
        mixed = self._x * phase.self_weight
        for peer, weight in phase.out_weights.items():
            latest = self._latest.get(peer)
            mixed.add_(latest[1] if latest is not None else self._x, alpha=weight)
        self._x = mixed
