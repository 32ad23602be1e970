"""What every gossip algorithm looks like to the agent: tensors in, tensors out, no I/O.

One round of an agent is ``apply_update`` (local optimisation) -> ``share`` (split mass and
build one payload per out-neighbour) -> transport -> ``receive`` on the other side ->
``mix`` (fold what has arrived into the state). ``on_ack`` tells the sender what the
receiver has absorbed. The agent serialises calls with one lock; algorithms are not
thread-safe themselves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from edge.topology.mixing import Phase


class ProtocolError(ValueError):
    """A message that is well formed but does not fit the receiver's per-edge state."""


@dataclass(frozen=True)
class Payload:
    """What one out-neighbour gets this round.

    Attributes
    ----------
    vector:
        Flat tensor to encode and send (a fresh tensor the caller may keep).
    scalars:
        Small named values (the push-sum weight, ...).
    seq:
        Per-edge sequence number, strictly increasing from 1.
    base_seq:
        For running sums: the seq the cumulative values are measured from.
    """

    vector: torch.Tensor
    scalars: dict[str, float] = field(default_factory=dict)
    seq: int = 0
    base_seq: int = 0


@dataclass(frozen=True)
class Ack:
    """What a receiver reports back for one message."""

    last_seq: int
    base_seq: int
    absorbed: bool
    round: int = 0


class GossipAlgorithm(ABC):
    """Base class of gossip algorithms; see the module docstring for the call order."""

    name: str = ""
    #: Whether the algorithm runs on directed graphs (column-stochastic weights suffice).
    supports_directed: bool = True

    def __init__(self, initial: torch.Tensor, *, dtype: torch.dtype = torch.float32) -> None:
        if initial.dim() != 1:
            raise ValueError(
                f"gossip state must be a flat vector, got shape {tuple(initial.shape)}"
            )
        self.dtype = dtype
        self.numel = initial.numel()

    @abstractmethod
    def estimate(self) -> torch.Tensor:
        """The current model estimate (de-biased where the algorithm needs it); a copy."""

    @abstractmethod
    def apply_update(self, delta: torch.Tensor) -> None:
        """Add a local optimisation step ``delta`` (new minus old estimate) to the state."""

    @abstractmethod
    def share(self, phase: Phase, ready: Collection[str]) -> dict[str, Payload]:
        """Split this round's mass along ``phase`` and return payloads for the ``ready`` peers.

        Peers of the phase that are not ready (a send still in flight) get no payload this
        round; what that means for their share is the algorithm's business.
        """

    @abstractmethod
    def receive(self, sender: str, payload: Payload) -> Ack:
        """Take one incoming payload (already decoded and validated).

        Raises
        ------
        ProtocolError
            When the payload does not fit the per-edge state (state is left unchanged).
        """

    @abstractmethod
    def mix(self) -> None:
        """Fold everything received since the last call into the state."""

    def on_ack(self, peer: str, ack: Ack) -> None:  # noqa: B027 - optional hook
        """The receiver ``peer`` acknowledged our latest message to it."""

    def on_refused(self, peer: str) -> None:  # noqa: B027 - optional hook
        """``peer`` refused our message as not fitting its edge state (it restarted, say)."""

    def scalars(self) -> dict[str, float]:
        """Small per-agent figures worth reporting (the push-sum weight, ...)."""
        return {}
