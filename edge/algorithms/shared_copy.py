"""Compressed gossip through shared copies: quantized push-sum and CHOCO, exact under loss.

Both algorithms send compressed *differences* to a copy both ends of an edge hold, so what is
compressed shrinks as the fleet agrees and the compression error dies out with it:

- ``quantized-push-sum`` (Taheri, Mokhtari, Hassani & Pedarsani, ICML 2020):
  ``q = Q(x - xhat)``, ``xhat += q``, ``x <- x + gamma (sum_j W[i, j] xhat_j - xhat_i)``,
  ``y <- y + gamma (W y - y)``, estimate ``x / y``; column-stochastic ``W``, so directed
  graphs are fine. ``gamma < 1`` (the consensus step) keeps very low bit widths stable.
- ``choco`` (CHOCO-Gossip / CHOCO-SGD, Koloskova, Stich & Jaggi 2019): the same update with
  doubly stochastic Metropolis–Hastings weights, on undirected graphs, meant for biased
  sparsifiers (top-k, random-k): whatever ``C(x - xhat)`` leaves out stays in ``x - xhat``
  and goes out later (error feedback).

Read per edge, the update is a flow: every round agent ``i`` gives ``gamma W[j, i]`` of its
weight ``y`` and the matching mass to each out-neighbour ``j``. Here:

- **The shared copy is of the estimate** ``z = x / y``, and the mass that goes with a weight
  flow ``f`` is ``f * zhat``. When ``zhat = z`` that is exactly the flow above (``f * z =
  gamma W[j, i] x``). Tracking ``z`` rather than ``x`` matters on lossy links: a late message
  makes its receiver's ``x`` and ``y`` jump together, but not ``z``, so the compressed
  differences still vanish as the fleet agrees. (With doubly stochastic weights and no loss
  ``y`` stays exactly 1, and ``choco`` is CHOCO as published.)
- **Copies are per edge.** Each out-edge keeps its own copy and makes its own compressed
  increments (blocks), numbered from 1; the receiver holds the same copy.
- **Blocks are replayed until acknowledged.** Each round the sender makes one block per
  out-edge, ``copy += q``, and gives ``f`` and ``f * copy`` away at once. A message carries
  every block of the edge not yet acknowledged (at most :data:`MAX_BLOCKS`); the receiver
  applies the ones it has not seen, in order: ``copy += q``, then takes ``f`` and
  ``f * copy``. Both ends compute every flow from identical numbers, so total mass is
  conserved exactly; duplicates and stale messages change nothing.

An edge with :data:`MAX_BLOCKS` unacknowledged blocks (a dead neighbour) makes no new ones:
its share of the round stays home, and memory and message size stay bounded. A receiver
that lost its state (a restart) cannot place blocks that build on a copy it no longer has;
the sender then takes back the flows it never delivered and starts that edge over from the
start copy (see :meth:`SharedCopyGossip.restart_out_edge`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from airgossip.common.topology.mixing import Phase
from airgossip.edge.algorithms.base import (
    Ack,
    InvalidPayload,
    Payload,
    ProtocolError,
    check_sequence,
    check_weight,
    refuse_amplifying_codec,
)
from airgossip.edge.algorithms.push_sum import PushSumCore
from airgossip.edge.algorithms.state import AlgorithmState, state_tensor
from airgossip.edge.compression import (
    Codec,
    Encoded,
    QSGDCodec,
    RandomKCodec,
    SlimCodec,
    TopKCodec,
    join_blocks,
)

#: Most unacknowledged blocks an edge keeps (and one message carries).
MAX_BLOCKS = 16


class SharedCopyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gamma: float | None = Field(
        None, gt=0, le=1, description="consensus step size; default: see default_gamma"
    )


def default_gamma(codec: Codec) -> float:
    """The consensus step when none is given: what the codec's error allows.

    1 for codecs that keep every coordinate with fine levels (raw, fp16, bf16, qsgd of 3+
    bits); 0.5 for ``qsgd:2`` (Taheri et al.: 2 bits need ``gamma <= 0.5``);
    ``sqrt(FRACTION)`` for sparsifiers (0.1 for 1%), measured best for learning on digits;
    pure consensus from scratch with a sparsifier may need ``gamma`` near ``FRACTION``, as
    CHOCO's analysis asks.
    """
    if isinstance(codec, TopKCodec | RandomKCodec | SlimCodec):
        return min(1.0, math.sqrt(codec.fraction))
    if isinstance(codec, QSGDCodec) and codec.bits <= 2:
        return 0.5
    return 1.0


@dataclass
class _Block:
    index: int
    encoded: Encoded
    q: torch.Tensor  # the decoded increment of the copy
    y: float  # weight given away with the block
    flow: torch.Tensor  # the mass given away with it: y * (the copy after this block)


@dataclass
class _OutEdge:
    copy: torch.Tensor  # the receiver's copy once every block so far is applied
    next: int = 1  # index of the next block
    restart: int = 0  # the receiver's copy after block `restart` is the start copy
    blocks: list[_Block] = field(default_factory=list)


@dataclass
class _InEdge:
    copy: torch.Tensor
    last: int = 0  # the last block applied


class SharedCopyGossip(PushSumCore):
    """Per-edge shared copies of the estimate, compressed increments replayed until
    acknowledged; see the module docstring.

    **Restarts.** Copies are edge state: a restarted agent starts every edge over (a new
    lineage, see :mod:`airgossip.edge.agent.lineage`), from the start copy on both ends.
    """

    max_blocks: ClassVar[int] = MAX_BLOCKS
    options_model: ClassVar[type[BaseModel]] = SharedCopyOptions

    @classmethod
    def check_codec(cls, codec: Codec) -> None:
        refuse_amplifying_codec(cls.name, codec)

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        assert isinstance(self.options, SharedCopyOptions)
        self.gamma = self.options.gamma or default_gamma(self.codec)
        # Both ends must start a copy from the same vector: the shared initial parameters of a
        # learning task, or zero when agents start apart (consensus).
        self._start = self._x.clone() if self.shared_start else torch.zeros_like(self._x)
        self._out: dict[str, _OutEdge] = {}
        self._in: dict[str, _InEdge] = {}

    # -- sending -----------------------------------------------------------------------------
    def share(self, phase: Phase, ready: Collection[str]) -> dict[str, Payload]:
        z = self._x / self._y
        new: list[_Block] = []
        for peer, weight in phase.out_weights.items():
            edge = self._out.get(peer)
            if edge is None:
                edge = self._out[peer] = _OutEdge(self._start.clone())
            if len(edge.blocks) >= MAX_BLOCKS:
                continue  # a stalled edge: this round's share stays home
            encoded, q = self.encode(z - edge.copy, peer)
            edge.copy.add_(q)
            y = self.gamma * weight * self._y
            edge.blocks.append(_Block(edge.next, encoded, q, y, edge.copy * y))
            edge.next += 1
            new.append(edge.blocks[-1])
        # Flows leave once every edge's q has been taken from the same z, as in the update.
        for block in new:
            self._x.sub_(block.flow)
            self._y -= block.y
        return {
            peer: self._message(edge)
            for peer, edge in self._out.items()
            if edge.blocks and peer in ready  # edges off this phase still replay what is owed
        }

    def _message(self, edge: _OutEdge) -> Payload:
        blocks = edge.blocks
        base = blocks[0].index - 1
        scalars = {f"y{i}": b.y for i, b in enumerate(blocks, 1)}
        if base == edge.restart:
            scalars["restart"] = 1.0
        vector = blocks[0].q if len(blocks) == 1 else torch.cat([b.q for b in blocks])
        encoded = join_blocks([b.encoded for b in blocks])
        return Payload(vector, scalars, blocks[-1].index, base, encoded=encoded)

    def on_ack(self, peer: str, ack: Ack) -> None:
        edge = self._out.get(peer)
        if edge is not None:
            edge.blocks = [b for b in edge.blocks if b.index > ack.last_seq]

    def forget_in_edge(self, sender: str) -> None:
        self._in.pop(sender, None)

    def restart_out_edge(self, peer: str) -> None:
        edge = self._out.get(peer)
        if edge is None:
            return
        # The receiver cannot place our blocks (it lost its state): take back the flows it
        # never got and start the edge over from the start copy, saying so in the next
        # message.
        for block in edge.blocks:
            self._x.add_(block.flow)
            self._y += block.y
        edge.blocks.clear()
        edge.copy = self._start.clone()
        edge.restart = edge.next - 1

    # -- receiving ---------------------------------------------------------------------------
    def _weights(self, sender: str, payload: Payload, count: int) -> list[float]:
        # Zero is the weight of a block made for a peer that is only probed.
        return [
            check_weight(f"y{i}", sender, payload.scalars.get(f"y{i}"), positive=False)
            for i in range(1, count + 1)
        ]

    def receive(self, sender: str, payload: Payload) -> Ack:
        n = self.numel
        count, rest = divmod(payload.vector.numel(), n) if n else (0, 1)
        if rest or count != payload.seq - payload.base_seq or not 1 <= count <= MAX_BLOCKS:
            raise InvalidPayload(
                f"{self.name} message from '{sender}' holds {payload.vector.numel()} elements "
                f"for blocks {payload.base_seq + 1}..{payload.seq} of {n}"
            )
        weights = self._weights(sender, payload, count)
        restart = payload.scalars.get("restart", 0.0) == 1.0
        edge = self._in.get(sender)
        last = edge.last if edge is not None else 0
        if payload.seq <= last:
            # nothing new: a duplicate or a stale copy
            return Ack(last, 0, absorbed=False)
        if payload.base_seq > last and not restart:
            raise ProtocolError(
                f"message from '{sender}' starts after block {payload.base_seq}, but this edge "
                f"holds blocks up to {last} only",
                reason="cannot_place",
            )
        if restart:  # a restart may jump ahead, but not arbitrarily far
            check_sequence(sender, payload.base_seq, last if edge is not None else None)
        copy, applied = (edge.copy, edge.last) if edge is not None else (self._start, 0)
        if restart and payload.base_seq >= applied:
            copy, applied = self._start, payload.base_seq
        # Apply the new blocks to copies, check the state they lead to, then keep them.
        copy = copy.clone()
        pending_x, pending_y = self._pending_x.clone(), self._pending_y
        vector = payload.vector.to(self.dtype)
        for i, y in enumerate(weights):
            if payload.base_seq + 1 + i <= applied:
                continue
            copy.add_(vector[i * n : (i + 1) * n])
            pending_x.add_(copy * y)
            pending_y += y
        self._check_pending(sender, pending_x, pending_y)
        if edge is None:
            edge = self._in[sender] = _InEdge(copy)
        edge.copy, edge.last = copy, payload.seq
        self._pending_x, self._pending_y = pending_x, pending_y
        return Ack(edge.last, 0, absorbed=True)

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> AlgorithmState:
        return {**super().state_dict(), "start": self._start.clone()}

    def load_state_dict(self, state: AlgorithmState) -> None:
        super().load_state_dict(state)
        self._start = state_tensor(state, "start").to(self.dtype).clone()

    # -- inspection (tests, benchmarks) ------------------------------------------------------
    def in_flight(self) -> tuple[torch.Tensor, float]:
        """``(x, y)`` given away but not acknowledged yet (on the wire, or lost and owed)."""
        x, y = torch.zeros_like(self._x), 0.0
        for edge in self._out.values():
            for block in edge.blocks:
                x.add_(block.flow)
                y += block.y
        return x, y

    def unacknowledged(self, peer: str) -> int:
        """Blocks of the edge to ``peer`` not yet acknowledged."""
        edge = self._out.get(peer)
        return len(edge.blocks) if edge is not None else 0


class QuantizedPushSum(SharedCopyGossip):
    """Quantized push-sum (Taheri et al. 2020) with per-edge copies, exact under loss."""

    name = "quantized-push-sum"


class Choco(SharedCopyGossip):
    """CHOCO-Gossip/SGD (Koloskova et al. 2019) with per-edge copies, exact under loss."""

    name = "choco"
    mixing = "metropolis-hastings"
