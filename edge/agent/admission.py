"""What an agent lets near its gossip state: every check an incoming message passes first.

A message is meant for this agent and this fleet, comes from an assigned in-neighbour (or a
recent former one, which may still deliver what its edge owes), runs the same algorithm on
the same task, has the shape, codec and size of this model, numbers its messages sensibly
and holds finite values. The algorithm then refuses what does not fit the edge or would
leave the state out of bounds. Nothing here changes gossip state: a refusal is a
:class:`~airgossip.edge.transport.base.Rejected` handed to the agent's ``refuse`` callback (which
counts and logs it) and raised.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import torch

from airgossip.edge.algorithms import GossipAlgorithm, Payload
from airgossip.edge.compression import DecodeError, Encoded, decode_blocks, get_codec
from airgossip.edge.settings import MAX_MIXING_STEPS
from airgossip.edge.transport.base import GossipMessage, MessageHeader, RejectCode, Rejected
from airgossip.edge.transport.wire import MAX_HEADER_BYTES

#: A peer that stops being an in-neighbour (the graph changed) may still deliver what its
#: edge owes for this many of our rounds.
FORMER_ROUNDS = 64
#: Largest round number a message may name (it only orders messages; far beyond any run).
MAX_ROUND = 1 << 48


class Admission:
    """The checks of one agent's incoming messages, and who its in-neighbours are.

    Parameters
    ----------
    agent_id, fleet, digest:
        Who this agent is: messages must name it, its fleet and its task digest.
    algorithm, block_numel, max_blocks, dtype:
        What the gossip state expects: the algorithm's name, elements per block, most blocks
        per message, and the dtype payloads are decoded to.
    refuse:
        Called with every refusal before it is raised (the agent counts and logs it).
    """

    def __init__(
        self,
        agent_id: str,
        *,
        fleet: str,
        digest: str,
        algorithm: str,
        block_numel: int,
        max_blocks: int,
        dtype: torch.dtype,
        refuse: Callable[[Rejected], None],
    ) -> None:
        self.agent_id = agent_id
        self.fleet = fleet
        self.digest = digest
        self.algorithm = algorithm
        self.block_numel = block_numel
        self.max_blocks = max_blocks
        self.dtype = dtype
        self._refuse = refuse
        self.in_neighbours: frozenset[str] = frozenset()
        self._former: dict[str, int] = {}  # former in-neighbour -> our round when it left

    @classmethod
    def of(
        cls,
        agent_id: str,
        algorithm: GossipAlgorithm,
        *,
        fleet: str,
        digest: str,
        refuse: Callable[[Rejected], None],
    ) -> Admission:
        """The admission of an agent whose gossip state is ``algorithm``."""
        return cls(
            agent_id, fleet=fleet, digest=digest, algorithm=algorithm.name,
            block_numel=algorithm.block_numel, max_blocks=algorithm.max_blocks,
            dtype=algorithm.dtype, refuse=refuse,
        )  # fmt: skip

    def reject(self, code: RejectCode, reason: str, kind: str = "", sender: str = "") -> Rejected:
        """A refusal, already handed to the agent's callback: raise it. It is charged to
        ``sender`` only when that is a current in-neighbour (so that no message can create
        per-peer series at will)."""
        charged = sender if sender in self.in_neighbours else ""
        error = Rejected(code, reason, kind=kind, sender=charged)
        self._refuse(error)
        return error

    # -- who may speak -----------------------------------------------------------------------
    def set_in_neighbours(self, incoming: Iterable[str], round_index: int) -> None:
        """A new assignment's in-neighbours; those that left stay heard for a while."""
        incoming = frozenset(incoming)
        for peer in self.in_neighbours - incoming:
            self._former[peer] = round_index
        for peer in incoming:
            self._former.pop(peer, None)
        self.in_neighbours = incoming

    def hears(self, sender: str, round_index: int) -> bool:
        """``sender`` is an in-neighbour, or was one within :data:`FORMER_ROUNDS` rounds."""
        if sender in self.in_neighbours:
            return True
        left = self._former.get(sender)
        return left is not None and round_index - left <= FORMER_ROUNDS

    def check_sender(self, sender: str, round_index: int, *, assigned: bool) -> None:
        """Refuse a sender before a byte of its message is read: the agent has no neighbours
        yet (``assigned`` False), or ``sender`` is not one it hears."""
        if not assigned:
            raise self.reject(
                RejectCode.UNAVAILABLE,
                f"{self.agent_id} has no neighbours yet",
                "no_neighbours",
                sender=sender,
            )
        if not self.hears(sender, round_index):
            raise self.reject(
                RejectCode.PERMISSION_DENIED,
                f"sender {sender[:64]!r} is not an in-neighbour of {self.agent_id}",
                "not_in_neighbour",
                sender=sender,
            )

    # -- what it may say ---------------------------------------------------------------------
    def check_header(self, header: MessageHeader, round_index: int, epoch: int | None) -> None:
        """Refuse a header that does not fit this agent (``epoch``: the assignment's, None
        when the agent has none yet)."""
        if header.receiver != self.agent_id:
            raise self.reject(
                RejectCode.PERMISSION_DENIED,
                f"message for {header.receiver[:64]!r} sent to {self.agent_id}",
                "wrong_receiver",
                sender=header.sender,
            )
        if header.fleet != self.fleet:
            raise self.reject(
                RejectCode.PERMISSION_DENIED,
                f"message of fleet {header.fleet[:64]!r}; this agent is in fleet {self.fleet!r}",
                "wrong_fleet",
                sender=header.sender,
            )
        if epoch is not None and not self.hears(header.sender, round_index):
            raise self.reject(
                RejectCode.PERMISSION_DENIED,
                f"sender {header.sender[:64]!r} is not an in-neighbour of {self.agent_id} "
                f"(its assignment epoch {header.epoch}, ours {epoch})",
                "not_in_neighbour",
                sender=header.sender,
            )
        self.check_sender(header.sender, round_index, assigned=epoch is not None)
        if header.algorithm != self.algorithm:
            raise self.reject(
                RejectCode.FAILED_PRECONDITION,
                f"algorithm '{header.algorithm[:64]}' does not match this agent's "
                f"'{self.algorithm}'",
                "wrong_algorithm",
                sender=header.sender,
            )
        if self.digest and header.fleet_digest != self.digest:
            raise self.reject(
                RejectCode.FAILED_PRECONDITION,
                f"sender's task or initial parameters differ (digest "
                f"{header.fleet_digest[:64]!r}, expected {self.digest!r})",
                "wrong_task",
                sender=header.sender,
            )
        self._check_size(header)
        if header.base_seq > header.seq or header.round > MAX_ROUND:
            raise self.reject(
                RejectCode.INVALID_ARGUMENT,
                f"sequence numbers out of order (seq {header.seq}, base {header.base_seq})"
                if header.base_seq > header.seq
                else f"round {header.round} is beyond {MAX_ROUND}",
                "sequence",
                sender=header.sender,
            )
        if header.step >= MAX_MIXING_STEPS or header.steps > MAX_MIXING_STEPS:
            raise self.reject(
                RejectCode.INVALID_ARGUMENT,
                f"gossip step {header.step} of {header.steps} a round is beyond the most a "
                f"round takes ({MAX_MIXING_STEPS} steps, numbered from 0)",
                "sequence",
                sender=header.sender,
            )

    def _check_size(self, header: MessageHeader) -> None:
        block, most = self.block_numel, self.max_blocks
        blocks, rest = divmod(header.numel, block) if block else (int(header.numel == 0), 0)
        if rest or not 1 <= blocks <= most:
            expected = (
                f"this model has {block}"
                if most == 1
                else f"expected 1 to {most} blocks of {block}"
            )
            raise self.reject(
                RejectCode.INVALID_ARGUMENT,
                f"wrong shape: {header.numel} elements, {expected}",
                "wrong_shape",
                sender=header.sender,
            )
        try:
            codec = get_codec(header.codec)
        except ValueError as err:
            raise self.reject(
                RejectCode.INVALID_ARGUMENT, str(err)[:300], "codec", sender=header.sender
            ) from None
        bound = blocks * codec.max_bytes(block)
        if header.payload_bytes > bound:
            raise self.reject(
                RejectCode.INVALID_ARGUMENT,
                f"payload of {header.payload_bytes} bytes exceeds the {codec.spec} size for "
                f"{header.numel} elements ({bound})",
                "too_large",
                sender=header.sender,
            )
        if len(header.codec_meta) > MAX_HEADER_BYTES:
            raise self.reject(
                RejectCode.INVALID_ARGUMENT,
                "codec metadata too large",
                "codec",
                sender=header.sender,
            )

    def decode(self, message: GossipMessage) -> Payload:
        """The payload of an admitted message (:meth:`check_header` passed), decoded; refused
        when it does not decode or holds a value that is not finite."""
        header = message.header
        # An in-process sender's decoded vector, copied: no bytes to decode.
        vector = _handed_over(message, self.dtype)
        if vector is None:
            vector = self._decode_bytes(message)
        if not all_finite(vector):
            raise self.reject(
                RejectCode.INVALID_ARGUMENT,
                "payload holds NaN or infinite values",
                "non_finite",
                sender=header.sender,
            )
        bad = [k[:32] for k, v in header.scalars.items() if not math.isfinite(v)]
        if bad:
            raise self.reject(
                RejectCode.INVALID_ARGUMENT,
                f"scalar(s) {', '.join(bad)} not finite",
                "non_finite",
                sender=header.sender,
            )
        return Payload(vector, dict(header.scalars), header.seq, header.base_seq)

    def _decode_bytes(self, message: GossipMessage) -> torch.Tensor:
        header = message.header
        codec = get_codec(header.codec)
        try:
            vector = decode_blocks(
                codec,
                Encoded(header.codec, header.numel, message.data, header.codec_meta),
                self.block_numel,
                self.dtype,
            )
        except DecodeError as err:
            raise self.reject(
                RejectCode.INVALID_ARGUMENT, str(err), "undecodable", sender=header.sender
            ) from None
        return vector


def _handed_over(message: GossipMessage, dtype: torch.dtype) -> torch.Tensor | None:
    """A copy of the sender's decoded vector when an in-process transport handed it over and
    it is what decoding the header's payload would give (the receiver may keep it)."""
    decoded = message.decoded
    if decoded is None or decoded.dtype != dtype or decoded.shape != (message.header.numel,):
        return None  # not handed over, or not the flat vector the bytes decode to
    return (decoded.detach() if decoded.requires_grad else decoded).clone()


def all_finite(vector: torch.Tensor) -> bool:
    """Whether every element of ``vector`` is finite."""
    # A finite sum of squares means every element is finite; only a non-finite one (NaN,
    # infinity or an overflow of finite values) needs the element-wise check. numpy's dot is
    # the cheapest pass over a small vector.
    array = vector.numpy()
    with np.errstate(over="ignore"):  # huge finite values overflow the sum: checked below
        return math.isfinite(array.dot(array)) or bool(np.isfinite(array).all())
