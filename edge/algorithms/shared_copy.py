"""Compressed gossip through shared copies: quantized push-sum and CHOCO, exact under loss.

Both algorithms send compressed *differences* to a copy both ends of an edge hold, so what is
compressed shrinks as the fleet agrees and the compression error dies out with it:

- ``quantized-push-sum`` (Taheri, Mokhtari, Hassani & Pedarsani, ICML 2020):
  ``q = Q(x - xhat)``, ``xhat += q``, ``x <- x + gamma (sum_j W[i, j] xhat_j - xhat_i)``,
  ``y <- y + gamma (W y - y)``, estimate ``x / y``; column-stochastic ``W``, so directed
  graphs are fine. ``gamma < 1`` (the consensus step) keeps very low bit widths stable.
- ``choco`` (CHOCO-Gossip / CHOCO-SGD, Koloskova, Stich & Jaggi 2019): the same update with
  doubly stochastic Metropolis–Hastings weights and no push-sum weight (the model is ``x``),
  on undirected graphs, meant for biased sparsifiers (top-k, random-k): whatever ``C(x -
  xhat)`` leaves out stays in ``x - xhat`` and goes out later (error feedback).

Read per edge, the update is a flow: every round agent ``i`` gives ``gamma W[j, i] xhat``
to each out-neighbour ``j``. Total mass is conserved exactly when both ends agree on every
copy and every flow, which a single lost message would break for ever. So here:

- **Copies are per edge.** Each out-edge has its own copy of ``x`` and its own compressed
  increments (blocks), numbered from 1; the receiver holds the same copy.
- **Blocks are replayed until acknowledged.** A message carries every block of the edge not
  yet acknowledged (at most :data:`MAX_BLOCKS`); the receiver applies the ones it has not
  seen, in order: ``copy += q``, then takes the block's flow ``w * copy`` (and the push-sum
  weight flow). Duplicates and stale messages change nothing.
- **The sender gives a flow away only when it is acknowledged**, replaying the acknowledged
  blocks on its own copy of the receiver's copy: both ends compute every flow from identical
  numbers, and a lost message moves nothing on either side, so no agent's model dips while
  a message is lost.

An edge with :data:`MAX_BLOCKS` unacknowledged blocks (a dead neighbour) makes no new ones:
its share of the round stays home, and memory and message size stay bounded. A receiver
that lost its state (a restart) refuses blocks it cannot place; the sender then starts that
edge over from the start copy (see :meth:`on_refused`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from edge.algorithms.base import Ack, GossipAlgorithm, InvalidPayload, Payload, ProtocolError
from edge.compression import Encoded, join_blocks
from edge.topology.mixing import Phase

#: Most unacknowledged blocks an edge keeps (and one message carries).
MAX_BLOCKS = 16


class SharedCopyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gamma: float = Field(1.0, gt=0, le=1, description="consensus step size")


class ChocoOptions(SharedCopyOptions):
    gamma: float = Field(0.5, gt=0, le=1, description="consensus step size")


@dataclass
class _Block:
    index: int
    encoded: Encoded
    q: torch.Tensor  # the decoded increment of the copy
    weight: float  # gamma * W[peer, self] in the block's round
    y: float  # push-sum weight given away with it (0 without push-sum weights)


@dataclass
class _OutEdge:
    acked_copy: torch.Tensor  # the receiver's copy after the last acknowledged block
    copy: torch.Tensor  # the receiver's copy once every block so far is applied
    next: int = 1  # index of the next block
    restart: int = 0  # the receiver's copy after block `restart` is the start copy
    blocks: list[_Block] = field(default_factory=list)


@dataclass
class _InEdge:
    copy: torch.Tensor
    last: int = 0  # the last block applied


class SharedCopyGossip(GossipAlgorithm):
    """Per-edge shared copies, compressed increments replayed until acknowledged."""

    #: Push-sum weights (and the de-biased estimate ``x / y``).
    weighted: ClassVar[bool] = True
    max_blocks: ClassVar[int] = MAX_BLOCKS
    options_model: ClassVar[type[BaseModel]] = SharedCopyOptions

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        assert isinstance(self.options, SharedCopyOptions)
        self.gamma = self.options.gamma
        self._x = initial.detach().to(device="cpu", dtype=self.dtype).clone()
        self._y = 1.0
        self._pending_x = torch.zeros_like(self._x)
        self._pending_y = 0.0
        # Both ends must start a copy from the same vector: the shared initial parameters of a
        # learning task, or zero when agents start apart (consensus).
        self._start = self._x.clone() if self.shared_start else torch.zeros_like(self._x)
        self._out: dict[str, _OutEdge] = {}
        self._in: dict[str, _InEdge] = {}

    @property
    def x(self) -> torch.Tensor:
        return self._x

    @property
    def y(self) -> float:
        return self._y

    def estimate(self) -> torch.Tensor:
        return self._x / self._y if self.weighted else self._x.clone()

    def apply_update(self, delta: torch.Tensor) -> None:
        self._x.add_(delta.to(self.dtype))

    def scalars(self) -> dict[str, float]:
        return {"weight": self._y} if self.weighted else {}

    # -- sending -----------------------------------------------------------------------------
    def share(self, phase: Phase, ready: Collection[str]) -> dict[str, Payload]:
        for peer, weight in phase.out_weights.items():
            edge = self._out.get(peer)
            if edge is None:
                edge = self._out[peer] = _OutEdge(self._start.clone(), self._start.clone())
            if len(edge.blocks) >= MAX_BLOCKS:
                continue  # a stalled edge: this round's share stays home
            encoded, q = self.encode(self._x - edge.copy, peer)
            edge.copy.add_(q)
            flow = self.gamma * weight
            y = flow * self._y if self.weighted else 0.0
            edge.blocks.append(_Block(edge.next, encoded, q, flow, y))
            edge.next += 1
        return {
            peer: self._message(edge)
            for peer, edge in self._out.items()
            if edge.blocks and peer in ready  # edges off this phase still replay what is owed
        }

    def _message(self, edge: _OutEdge) -> Payload:
        blocks = edge.blocks
        base = blocks[0].index - 1
        scalars = {f"w{i}": b.weight for i, b in enumerate(blocks, 1)}
        if self.weighted:
            scalars.update({f"y{i}": b.y for i, b in enumerate(blocks, 1)})
        if base == edge.restart:
            scalars["restart"] = 1.0
        vector = blocks[0].q if len(blocks) == 1 else torch.cat([b.q for b in blocks])
        encoded = join_blocks([b.encoded for b in blocks])
        return Payload(vector, scalars, blocks[-1].index, base, encoded=encoded)

    def on_ack(self, peer: str, ack: Ack) -> None:
        edge = self._out.get(peer)
        if edge is None:
            return
        done = 0
        for block in edge.blocks:
            if block.index > ack.last_seq:
                break
            # The receiver applied this block: give its flow away, computed as it did.
            edge.acked_copy.add_(block.q)
            self._x.sub_(edge.acked_copy, alpha=block.weight)
            self._y -= block.y
            done += 1
        del edge.blocks[:done]

    def on_refused(self, peer: str) -> None:
        edge = self._out.get(peer)
        if edge is None:
            return
        # The receiver cannot place our blocks (it lost its state). Unacknowledged blocks were
        # never given away, so dropping them loses nothing; start the edge over from the
        # start copy and say so in the next message.
        edge.blocks.clear()
        edge.copy = self._start.clone()
        edge.acked_copy = self._start.clone()
        edge.restart = edge.next - 1

    # -- receiving ---------------------------------------------------------------------------
    def _flows(self, sender: str, payload: Payload, count: int) -> list[tuple[float, float]]:
        flows = []
        for i in range(1, count + 1):
            weight = payload.scalars.get(f"w{i}")
            y = payload.scalars.get(f"y{i}", 0.0) if self.weighted else 0.0
            if weight is None or not (0.0 <= weight <= 1.0):
                raise InvalidPayload(
                    f"{self.name} message from '{sender}': block {i} needs a flow weight "
                    f"'w{i}' within [0, 1], got {weight}"
                )
            if self.weighted and (f"y{i}" not in payload.scalars or not 0.0 <= y < math.inf):
                raise InvalidPayload(
                    f"{self.name} message from '{sender}': block {i} needs a finite, "
                    f"non-negative weight flow 'y{i}'"
                )
            flows.append((weight, y))
        return flows

    def receive(self, sender: str, payload: Payload) -> Ack:
        n = self.numel
        count, rest = divmod(payload.vector.numel(), n) if n else (0, 1)
        if rest or count != payload.seq - payload.base_seq or not 1 <= count <= MAX_BLOCKS:
            raise InvalidPayload(
                f"{self.name} message from '{sender}' holds {payload.vector.numel()} elements "
                f"for blocks {payload.base_seq + 1}..{payload.seq} of {n}"
            )
        flows = self._flows(sender, payload, count)
        restart = payload.scalars.get("restart", 0.0) == 1.0
        edge = self._in.get(sender)
        last = edge.last if edge is not None else 0
        if payload.seq <= last:
            return Ack(last, 0, absorbed=False)  # nothing new: a duplicate or a stale copy
        if payload.base_seq > last and not restart:
            raise ProtocolError(
                f"message from '{sender}' starts after block {payload.base_seq}, but this edge "
                f"holds blocks up to {last} only"
            )
        if edge is None:
            edge = self._in[sender] = _InEdge(self._start.clone())
        if restart and payload.base_seq >= edge.last:
            edge.copy, edge.last = self._start.clone(), payload.base_seq
        vector = payload.vector.to(self.dtype)
        for i, (weight, y) in enumerate(flows):
            index = payload.base_seq + 1 + i
            if index <= edge.last:
                continue
            edge.copy.add_(vector[i * n : (i + 1) * n])
            self._pending_x.add_(edge.copy, alpha=weight)
            self._pending_y += y
        edge.last = payload.seq
        return Ack(edge.last, 0, absorbed=True)

    def mix(self) -> None:
        self._x.add_(self._pending_x)
        self._y += self._pending_y
        self._pending_x.zero_()
        self._pending_y = 0.0

    # -- inspection (tests, benchmarks) ------------------------------------------------------
    def mass(self) -> tuple[torch.Tensor, float]:
        """``(x, y)`` held by this agent, received-but-unmixed mass included."""
        return self._x + self._pending_x, self._y + self._pending_y

    def unacknowledged(self, peer: str) -> int:
        """Blocks of the edge to ``peer`` not yet acknowledged."""
        edge = self._out.get(peer)
        return len(edge.blocks) if edge is not None else 0


class QuantizedPushSum(SharedCopyGossip):
    """Quantized push-sum (Taheri et al. 2020) with per-edge copies, exact under loss."""

    name = "quantized-push-sum"
    weighted = True
    options_model = SharedCopyOptions


class Choco(SharedCopyGossip):
    """CHOCO-Gossip/SGD (Koloskova et al. 2019) with per-edge copies, exact under loss."""

    name = "choco"
    weighted = False
    supports_directed = False
    mixing = "metropolis-hastings"
    options_model = ChocoOptions
