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

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

from airgossip.common.options import validate_options
from airgossip.common.seeds import derive_seed
from airgossip.common.topology.mixing import Phase
from airgossip.edge.algorithms.graph_needs import supports_directed
from airgossip.edge.algorithms.state import AlgorithmState, state_int
from airgossip.edge.compression import (
    Codec,
    Encoded,
    RawCodec,
    decode_blocks,
    encode_blocks,
    raw_codec_for,
)

#: Most weight an agent may hold or one message carry. A fleet's weights sum to its size, so
#: anything near this is an attack or a bug, never a fleet.
MAX_WEIGHT = float(1 << 20)
#: Largest magnitude an element of an estimate (``x / y``) may reach through an absorption:
#: far beyond any model's parameters or a consensus vector, well inside float32's range.
MAX_MAGNITUDE = 1e15
#: How far past an edge's last sequence number a message may be. Honest senders never get
#: this far ahead (they number at most one message per round and stop numbering further
#: past the receiver's last acknowledgement, see :data:`SEQ_SLACK`).
SEQ_WINDOW = 1024
#: How far past the receiver's last acknowledged message a sender numbers before it reuses
#: its latest number (a dead peer probed for hours stays within :data:`SEQ_WINDOW`).
SEQ_SLACK = SEQ_WINDOW // 2
#: Largest sequence number an edge without state accepts (a restarted receiver, a new edge).
SEQ_LIMIT = 1 << 48


class ProtocolError(ValueError):
    """A message that is well formed but does not fit the receiver's per-edge state.

    ``reason`` is a short fixed label for metrics (never text from the message).
    """

    def __init__(self, message: str, *, reason: str = "edge_state") -> None:
        super().__init__(message)
        self.reason = reason


class InvalidPayload(ValueError):
    """A message that no state could accept (inconsistent block count, bad scalars, or an
    absorption that would leave the state non-finite or out of bounds).

    ``reason`` is a short fixed label for metrics (never text from the message).
    """

    def __init__(self, message: str, *, reason: str = "payload") -> None:
        super().__init__(message)
        self.reason = reason


def check_weight(name: str, sender: str, value: float | None, *, positive: bool) -> float:
    """``value`` as a weight a message may carry; :class:`InvalidPayload` if it is missing,
    not finite, negative (or zero when ``positive``) or above :data:`MAX_WEIGHT`."""
    low_ok = value is not None and (value > 0 if positive else value >= 0)
    if value is None or not math.isfinite(value) or not low_ok or value > MAX_WEIGHT:
        kind = "positive" if positive else "non-negative"
        raise InvalidPayload(
            f"message from '{sender}' needs a finite, {kind} weight '{name}' of at most "
            f"{MAX_WEIGHT:.0f}, got {value}",
            reason="weight",
        )
    return float(value)


def check_absorption(x: torch.Tensor, y: float, sender: str) -> None:
    """:class:`InvalidPayload` unless ``(x, y)`` is a state an agent may hold: ``x`` finite,
    ``0 < y <= MAX_WEIGHT`` and every element of ``x / y`` within :data:`MAX_MAGNITUDE`.

    Receivers call it on the state a message *would* leave them in, before changing
    anything: a message that would make the state non-finite, flip the weight's sign or
    blow the estimate up is refused whole.
    """
    if not (math.isfinite(y) and 0.0 < y <= MAX_WEIGHT):
        raise InvalidPayload(
            f"message from '{sender}' would leave this agent's weight at {y:g} (allowed: "
            f"above 0, at most {MAX_WEIGHT:.0f})",
            reason="out_of_bounds",
        )
    largest = float(x.abs().max()) if x.numel() else 0.0
    if not math.isfinite(largest) or largest > MAX_MAGNITUDE * y:
        raise InvalidPayload(
            f"message from '{sender}' would put an element of this agent's estimate at "
            f"{largest / y:.3g} (allowed: finite, within {MAX_MAGNITUDE:g})",
            reason="out_of_bounds",
        )


def check_message(vector: torch.Tensor, y: float, sender: str) -> None:
    """:class:`InvalidPayload` unless a message's own mass is one an agent could have sent:
    every element of ``vector`` within :data:`MAX_MAGNITUDE` times its weight ``y`` (a
    running sum of shares of bounded estimates is)."""
    largest = float(vector.abs().max()) if vector.numel() else 0.0
    if not largest <= MAX_MAGNITUDE * y:
        raise InvalidPayload(
            f"message from '{sender}' carries values up to {largest:.3g} for a weight of {y:g} "
            f"(allowed: within {MAX_MAGNITUDE:g} times the weight)",
            reason="out_of_bounds",
        )


def check_sequence(sender: str, seq: int, last: int | None) -> None:
    """:class:`InvalidPayload` for a sequence number too far ahead of the edge's ``last``
    (None: the edge has no state yet, so only :data:`SEQ_LIMIT` bounds it)."""
    limit = SEQ_LIMIT if last is None else last + SEQ_WINDOW
    if seq > limit:
        where = "an edge without state" if last is None else f"this edge's last, {last}"
        raise InvalidPayload(
            f"message from '{sender}' has sequence number {seq}, too far ahead of {where} "
            f"(at most {limit})",
            reason="sequence_ahead",
        )


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


class ModelNumbers:
    """Sequence numbers per peer of messages that each carry a whole model (the newest makes
    the older ones stale): one more per message, but never :data:`SEQ_SLACK` past what the
    peer acknowledged (the latest number again), and past whatever the peer reports holding."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.acked: dict[str, int] = {}

    def next(self, peer: str) -> int:
        seq = self.sent.get(peer, 0)
        if seq - self.acked.get(peer, 0) < SEQ_SLACK:
            seq = self.sent[peer] = seq + 1
        return seq

    def on_ack(self, peer: str, last_seq: int) -> None:
        self.acked[peer] = max(self.acked.get(peer, 0), last_seq)
        self.sent[peer] = max(self.sent.get(peer, 0), last_seq)


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
    """What a receiver reports back for one message.

    ``lineage`` and ``start_over`` are the agent's (see :mod:`airgossip.edge.agent.lineage`): the
    lineage of the edge the receiver holds, and whether it could not place the message, so
    that the sender starts the edge over.
    """

    last_seq: int
    base_seq: int
    absorbed: bool
    round: int = 0
    lineage: int = 0
    start_over: bool = False


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
        every agent its own (see :func:`~airgossip.common.seeds.derive_seed`).
    options:
        The algorithm's ``[algorithm_options]``, validated against :attr:`options_model`.
    shared_start:
        Every agent starts from the same ``initial`` (learning tasks), so algorithms that
        keep copies of their neighbours' values may start those copies there.
    """

    name: str = ""
    #: Whether the algorithm runs on directed graphs (column-stochastic weights suffice); set
    #: from :data:`~airgossip.edge.algorithms.graph_needs.UNDIRECTED_ONLY` by the algorithm's name.
    supports_directed: ClassVar[bool] = True
    #: Weighting scheme of the mixing matrix the algorithm needs (see
    #: ``airgossip.common.topology``).
    mixing: ClassVar[str] = "column-stochastic"
    #: Most blocks one message may carry (the receiver refuses more before buffering).
    max_blocks: ClassVar[int] = 1
    #: Validates ``[algorithm_options]``.
    options_model: ClassVar[type[BaseModel]] = NoOptions
    #: Combines models by distillation (:meth:`teachers`): the task must implement
    #: :class:`~airgossip.edge.tasks.base.Distiller`.
    needs_distillation: ClassVar[bool] = False
    #: May mix several times per local step (``mixing_steps``): its state stays exact however
    #: many exchanges come between two local steps, and its mix does nothing per round.
    several_mixes: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.supports_directed = supports_directed(cls.name)

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
        #: Messages whose influence a robust algorithm clipped, per sender (robust algorithms
        #: count here; every other algorithm leaves it empty).
        self.clipped_by_sender: Counter[str] = Counter()

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
            When the payload does not fit the per-edge state (state is left unchanged): the
            agent then has the sender start the edge over.
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

    def restart_out_edge(self, peer: str) -> None:  # noqa: B027 - optional hook
        """``peer`` holds nothing of the edge to it (it restarted, or could not place our
        message): make the next message to it carry everything it has not acknowledged,
        measured from nothing. Algorithms without per-edge history need nothing here."""

    def forget_in_edge(self, sender: str) -> None:  # noqa: B027 - optional hook
        """``sender`` started the edge from it over (it restarted): drop what this agent knew
        of that edge; what was absorbed stays."""

    def scalars(self) -> dict[str, float]:
        """Small per-agent figures worth reporting (the push-sum weight, ...)."""
        return {}

    def join_late(self, weight: float) -> None:  # noqa: B027 - optional hook
        """The agent joins a fleet under way with nothing of its past (no checkpoint): scale
        its own mass to ``weight``, so that its fresh state weighs little against the
        fleet's (its data already went into the fleet before it lost its state).
        Algorithms without a weight ignore it."""

    def starved(self) -> bool:
        """Whether the agent has so little mass left that it should give none away this round
        (it keeps its share at home and only flushes what its edges owe)."""
        return False

    # -- checkpoints ---------------------------------------------------------------------------
    # A checkpoint holds the agent's own state, never an edge's: an agent restarted from one
    # (however old) starts every edge over in a new lineage, so nothing it sends or absorbs
    # mixes its edges' history before the restart with what its peers hold since.

    def state_dict(self) -> AlgorithmState:
        """A consistent copy of the agent's own gossip state (no per-edge state): tensors
        (copies), numbers, strings, bytes, in nested dicts and lists (:data:`StateValue`)."""
        return {"algorithm": self.name, "numel": self.numel, "encodings": self._encodings}

    def load_state_dict(self, state: AlgorithmState) -> None:
        """Resume from a :meth:`state_dict` (of this algorithm and model size); every edge
        starts over. ``KeyError``/``TypeError``/``ValueError`` for a state of another
        algorithm or size, or with a part missing or of the wrong kind."""
        if state.get("algorithm") != self.name or state.get("numel") != self.numel:
            raise ValueError(
                f"checkpoint of {state.get('algorithm')!r} with {state.get('numel')!r} elements "
                f"cannot resume {self.name!r} with {self.numel}"
            )
        self._encodings = state_int(state, "encodings")
