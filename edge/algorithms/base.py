"""What every gossip algorithm looks like to the agent: tensors in, tensors out, no I/O.

One round of an agent is ``apply_update`` (local optimisation) -> ``share`` (split mass and
build one payload per out-neighbour) -> transport -> ``receive`` on the other side ->
``mix`` (fold what has arrived into the state). ``on_ack`` tells the sender what the
receiver has absorbed. The agent serialises calls with one lock; algorithms are not
thread-safe themselves.

An algorithm encodes its own payloads with the fleet's codec (:meth:`GossipAlgorithm.encode`)
because several of them must know exactly what the receiver will decode: a lossy codec's
error then stays with the sender and is sent later instead of being lost. A message vector
is one or more *blocks* of :attr:`GossipAlgorithm.block_numel` elements, each encoded on its
own (gradient tracking sends two, replaying algorithms send the blocks not yet acknowledged).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

from edge.compression import (
    Codec,
    Encoded,
    RawCodec,
    decode_blocks,
    encode_blocks,
    raw_codec_for,
)
from edge.options import validate_options
from edge.seeds import derive_seed
from edge.topology.mixing import Phase


class ProtocolError(ValueError):
    """A message that is well formed but does not fit the receiver's per-edge state."""


class InvalidPayload(ValueError):
    """A message that no state could accept (inconsistent block count, bad scalars)."""


def refuse_amplifying_codec(name: str, codec: Codec) -> None:
    """``ValueError`` for a codec whose error feedback diverges (see ``Codec.feedback_safe``)."""
    if not codec.feedback_safe:
        raise ValueError(
            f"{name} feeds the codec's error back into later messages, and {codec.spec} adds "
            "noise larger than the vector it encodes, so that error would grow without bound; "
            "use qsgd:2 or more bits, or push-sum-plain or dpsgd (no error feedback)"
        )


class NoOptions(BaseModel):
    """Options of an algorithm that has none."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_algorithm_options(
    name: str, model: type[BaseModel], options: Mapping[str, Any] | None
) -> BaseModel:
    """Validate ``[algorithm_options]`` against ``model``; ``ValueError`` naming what is wrong."""
    return validate_options(model, options, f"algorithm '{name}'")


@dataclass(frozen=True)
class Payload:
    """What one out-neighbour gets this round.

    Attributes
    ----------
    vector:
        Flat tensor: on the sending side what the receiver will decode, on the receiving
        side what was decoded (a fresh tensor the caller may keep).
    scalars:
        Small named values (the push-sum weight, ...).
    seq:
        Per-edge sequence number, strictly increasing from 1.
    base_seq:
        For running sums: the seq the cumulative values are measured from.
    encoded:
        The wire form of ``vector`` when the algorithm encoded it itself (the agent then
        sends these bytes as they are); None on the receiving side.
    """

    vector: torch.Tensor
    scalars: dict[str, float] = field(default_factory=dict)
    seq: int = 0
    base_seq: int = 0
    encoded: Encoded | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Ack:
    """What a receiver reports back for one message."""

    last_seq: int
    base_seq: int
    absorbed: bool
    round: int = 0


class GossipAlgorithm(ABC):
    """Base class of gossip algorithms; see the module docstring for the call order.

    Parameters
    ----------
    initial:
        The agent's initial parameters (flat).
    dtype:
        Precision of the gossip state.
    codec:
        Codec of every payload (default: the lossless codec of ``dtype``).
    seed:
        Root of the algorithm's random draws (stochastic rounding, random-k indices); give
        every agent its own (see :func:`~edge.seeds.derive_seed`).
    options:
        The algorithm's ``[algorithm_options]``, validated against :attr:`options_model`.
    shared_start:
        Every agent starts from the same ``initial`` (learning tasks), so algorithms that
        keep copies of their neighbours' values may start those copies there.
    """

    name: str = ""
    #: Whether the algorithm runs on directed graphs (column-stochastic weights suffice).
    supports_directed: bool = True
    #: Weighting scheme of the mixing matrix the algorithm needs (see ``edge.topology``).
    mixing: ClassVar[str] = "column-stochastic"
    #: Most blocks one message may carry (the receiver refuses more before buffering).
    max_blocks: ClassVar[int] = 1
    #: Validates ``[algorithm_options]``.
    options_model: ClassVar[type[BaseModel]] = NoOptions
    #: Combines models by distillation (:meth:`teachers`): the task must implement
    #: :class:`~edge.tasks.base.Distiller`.
    needs_distillation: ClassVar[bool] = False

    def __init__(
        self,
        initial: torch.Tensor,
        *,
        dtype: torch.dtype = torch.float32,
        codec: Codec | None = None,
        seed: int = 0,
        options: Mapping[str, Any] | None = None,
        shared_start: bool = False,
    ) -> None:
        if initial.dim() != 1:
            raise ValueError(
                f"gossip state must be a flat vector, got shape {tuple(initial.shape)}"
            )
        self.dtype = dtype
        self.numel = initial.numel()
        self.codec = codec if codec is not None else raw_codec_for(dtype)
        self.check_codec(self.codec)
        self.seed = seed
        self.options = parse_algorithm_options(self.name, self.options_model, options)
        self.shared_start = shared_start
        self._encodings = 0

    @classmethod
    def check_codec(cls, codec: Codec) -> None:
        """Raise ``ValueError`` if the algorithm cannot work with ``codec`` (default: any)."""
        return None

    @property
    def block_numel(self) -> int:
        """Elements per block of a message vector."""
        return self.numel

    def encode(self, vector: torch.Tensor, peer: str) -> tuple[Encoded, torch.Tensor]:
        """Encode a message vector for ``peer``: ``(wire form, what the receiver decodes)``.

        Each call draws from its own seed, derived from the algorithm's seed, the peer and a
        call counter: deterministic for a seed, independent between messages.
        """
        self._encodings += 1
        codec = self.codec
        if isinstance(codec, RawCodec) and codec.dtype == vector.dtype == self.dtype:
            # Lossless, no blocks to split: what the receiver decodes is the vector itself.
            return codec.encode(vector), vector.clone()
        # Hashing a seed per message costs more than a small raw encode: only when used.
        seed = derive_seed(self.seed, peer, self._encodings) if codec.randomised else 0
        encoded = encode_blocks(codec, vector, self.block_numel, seed=seed)
        return encoded, decode_blocks(codec, encoded, self.block_numel, self.dtype)

    def schedule(self, round_index: int, phase: Phase) -> Phase:
        """The phase the agent uses in ``round_index`` (algorithms that skip rounds override)."""
        return phase

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
        InvalidPayload
            When no state could accept it (state is left unchanged).
        """

    @abstractmethod
    def mix(self) -> None:
        """Fold everything received since the last call into the state."""

    def on_local_step(self, round_index: int, metrics: Mapping[str, float]) -> None:  # noqa: B027
        """The task trained for ``round_index``; ``metrics`` are its figures (its learning
        rate as ``lr``, when it reports one). Called after :meth:`apply_update`."""

    def teachers(self) -> list[torch.Tensor]:
        """Models to distil into this agent's model right after :meth:`mix` (ensemble
        compression), handed over once; none for algorithms that average parameters."""
        return []

    def on_ack(self, peer: str, ack: Ack) -> None:  # noqa: B027 - optional hook
        """The receiver ``peer`` acknowledged our latest message to it."""

    def on_refused(self, peer: str) -> None:  # noqa: B027 - optional hook
        """``peer`` refused our message as not fitting its edge state (it restarted, say)."""

    def scalars(self) -> dict[str, float]:
        """Small per-agent figures worth reporting (the push-sum weight, ...)."""
        return {}
