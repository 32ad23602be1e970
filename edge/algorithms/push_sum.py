"""Push-sum (SGP) over directed graphs, exact under message loss, and its textbook form.

Each agent keeps a value ``x`` and a weight ``y`` (starting at 1) and uses the de-biased
``z = x / y``. A round gives ``W[j, i]`` of ``(x, y)`` to each out-neighbour ``j`` and keeps
``W[i, i]``: the total of ``x`` and of ``y`` over the fleet is conserved, so ``z``
converges to the average on any strongly connected directed graph.

:class:`PushSum` makes that exact when messages are lost, duplicated or reordered. Each
out-edge keeps the *running sum* of everything ever given to it; a message carries the sum,
and the receiver adds the difference to the last sum it absorbed on that edge. A lost
message's mass simply arrives with the next one; a duplicate or a stale copy changes nothing.

Running sums grow without bound, and their difference loses precision as they grow. Here the
receiver's acknowledgement (the gRPC response) tells the sender which sum the receiver now
holds; both sides then measure later sums from that message (the *base*), so the numbers on
the wire stay the size of a few rounds' mass for ever.

With a lossy codec the sender measures from what the receiver *decoded*, not from what it
meant to send: the codec's error stays in the running sum and goes out with the next
message (error feedback), so the fleet's total is still conserved exactly. The estimates
then carry noise of the size of the codec's error on a round's worth of mass; algorithms
that compress vanishing differences instead (``quantized-push-sum``) converge exactly.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from airgossip.common.topology.mixing import Phase
from airgossip.edge.algorithms.base import (
    Ack,
    GossipAlgorithm,
    InvalidPayload,
    Payload,
    check_absorption,
    check_message,
    check_sequence,
    check_weight,
    refuse_amplifying_codec,
)
from airgossip.edge.algorithms.push_sum_rules import (
    Placement,
    absorbs,
    flushes,
    numbered,
    pending_weight,
    placement,
    rebases,
    starved,
)
from airgossip.edge.algorithms.state import AlgorithmState, state_float, state_tensor
from airgossip.edge.compression import Codec


def _weight_of(sender: str, payload: Payload, *, positive: bool) -> float:
    return check_weight("y", sender, payload.scalars.get("y"), positive=positive)


class PushSumCore(GossipAlgorithm):
    """The push-sum state ``(x, y)``, received mass held until the mix, the step at
    ``z = x / y``: shared by every algorithm that carries a weight (both push-sum variants,
    gradient tracking, local SGD, the shared-copy algorithms)."""

    def __init__(
        self,
        initial: torch.Tensor,
        *,
        dtype: torch.dtype = torch.float64,
        codec: Codec | None = None,
        seed: int = 0,
        options: Mapping[str, Any] | None = None,
        shared_start: bool = False,
    ) -> None:
        super().__init__(
            initial,
            dtype=dtype,
            codec=codec,
            seed=seed,
            options=options,
            shared_start=shared_start,
        )
        self._x = initial.detach().to(device="cpu", dtype=dtype).clone()
        self._y = 1.0
        self._pending_x = torch.zeros_like(self._x)
        self._pending_y = 0.0

    @property
    def x(self) -> torch.Tensor:
        return self._x

    @property
    def y(self) -> float:
        return self._y

    def estimate(self) -> torch.Tensor:
        return self._x / self._y

    def apply_update(self, delta: torch.Tensor) -> None:
        # The step is computed at z = x / y; adding y * delta moves z by exactly delta.
        # (Adding delta itself, as SGP does, moves z by delta / y: on lossy or lopsided
        # links y can sink far below 1 for a while and the step then blows up.)
        self._x.add_(delta.to(self.dtype), alpha=self._y)

    def mix(self) -> None:
        self._x.add_(self._pending_x)
        self._y += self._pending_y
        self._pending_x.zero_()
        self._pending_y = 0.0

    def scalars(self) -> dict[str, float]:
        return {"weight": self._y}

    def starved(self) -> bool:
        return starved(self._y)

    def join_late(self, weight: float) -> None:
        self._x.mul_(weight / self._y)
        self._y = weight

    def mass(self) -> tuple[torch.Tensor, float]:
        """``(x, y)`` held by this agent, received-but-unmixed mass included."""
        return self._x + self._pending_x, self._y + self._pending_y

    def _check_pending(self, sender: str, pending_x: torch.Tensor, pending_y: float) -> None:
        """Refuse (:class:`InvalidPayload`) unless the state after mixing ``pending`` in is
        one an agent may hold (see :func:`check_absorption`); changes nothing."""
        check_absorption(self._x + pending_x, self._y + pending_y, sender)

    def state_dict(self) -> AlgorithmState:
        return {
            **super().state_dict(),
            "x": self._x.clone(),
            "y": self._y,
            "pending_x": self._pending_x.clone(),
            "pending_y": self._pending_y,
        }

    def load_state_dict(self, state: AlgorithmState) -> None:
        super().load_state_dict(state)
        self._x = state_tensor(state, "x").to(self.dtype).clone()
        self._y = state_float(state, "y")
        self._pending_x = state_tensor(state, "pending_x").to(self.dtype).clone()
        self._pending_y = state_float(state, "pending_y")

    def _received_vector(self, sender: str, payload: Payload) -> torch.Tensor:
        if payload.vector.numel() != self._x.numel():
            raise InvalidPayload(
                f"{self.name} message from '{sender}' holds {payload.vector.numel()} elements, "
                f"expected {self._x.numel()}"
            )
        vector = payload.vector
        return vector if vector.dtype == self.dtype else vector.to(self.dtype)


@dataclass
class _OutEdge:
    sigma_x: torch.Tensor  # everything given to this edge since `base_seq`
    sigma_y: float = 0.0
    seq: int = 0
    base_seq: int = 0
    acked: int = 0  # the highest seq the receiver reported holding
    #: What the latest message carried, measured from `base_seq` (decoded: exactly what the
    #: receiver holds once it absorbs that message).
    sent: dict[int, tuple[torch.Tensor, float]] = field(default_factory=dict)


@dataclass
class _InEdge:
    rho_x: torch.Tensor  # the sender's running sum as of `last_seq`, measured from `base_seq`
    rho_y: float = 0.0
    last_seq: int = 0
    base_seq: int = 0


class PushSum(PushSumCore):
    """Push-sum with running sums per edge: exact under loss, duplication and reordering.

    **Restarts.** Running sums hold an edge's whole history, so an agent that lost its
    state cannot continue its edges: a restarted agent (from a checkpoint of any age, or
    from none) starts every edge over in a new lineage (the agent's bookkeeping, see
    :mod:`airgossip.edge.agent.lineage`), and a receiver that cannot place a message has the sender
    start over. Starting an out-edge over (:meth:`restart_out_edge`) sends everything the
    receiver has not acknowledged, measured from nothing; forgetting an in-edge
    (:meth:`forget_in_edge`) keeps what was absorbed. What a restart costs the fleet's mass
    is in docs/algorithms.md.
    """

    name = "push-sum"
    several_mixes = True

    @classmethod
    def check_codec(cls, codec: Codec) -> None:
        refuse_amplifying_codec(cls.name, codec)

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        self._out: dict[str, _OutEdge] = {}
        self._in: dict[str, _InEdge] = {}

    def share(self, phase: Phase, ready: Collection[str]) -> dict[str, Payload]:
        for peer, weight in phase.out_weights.items():
            edge = self._out.get(peer)
            if edge is None:
                edge = self._out[peer] = _OutEdge(torch.zeros_like(self._x))
            edge.sigma_x.add_(self._x, alpha=weight)
            edge.sigma_y += weight * self._y
        self._x.mul_(phase.self_weight)
        self._y *= phase.self_weight

        payloads = {}
        for peer, edge in self._out.items():
            if peer not in ready:
                continue  # its share waits in the running sum for the next message
            if not flushes(peer in phase.out_weights, edge.sigma_y):
                continue  # off this phase and nothing undelivered: no message
            encoded, decoded = self.encode(edge.sigma_x, peer)
            edge.sent.clear()  # only the latest message can be the receiver's last
            if numbered(edge.seq, edge.acked):
                edge.seq += 1
                edge.sent[edge.seq] = (decoded, edge.sigma_y)
            payloads[peer] = Payload(
                decoded, {"y": edge.sigma_y}, edge.seq, edge.base_seq, encoded=encoded
            )
        return payloads

    def on_ack(self, peer: str, ack: Ack) -> None:
        edge = self._out.get(peer)
        if edge is None:
            return
        edge.acked = max(edge.acked, ack.last_seq)
        sent = edge.sent.pop(ack.last_seq, None)
        if sent is None or not rebases(ack.last_seq, edge.base_seq):
            return  # nothing we can measure from
        # The receiver's sum is now exactly what it decoded: measure from there on both sides.
        x, y = sent
        edge.sigma_x.sub_(x)
        edge.sigma_y -= y
        edge.base_seq = ack.last_seq
        edge.sent.clear()

    def restart_out_edge(self, peer: str) -> None:
        edge = self._out.get(peer)
        if edge is None:
            return
        # What is held since the base is what the receiver has not acknowledged: all of it
        # goes with the next message, measured from nothing.
        edge.base_seq = 0
        edge.acked = edge.seq
        edge.sent.clear()

    def forget_in_edge(self, sender: str) -> None:
        self._in.pop(sender, None)

    def receive(self, sender: str, payload: Payload) -> Ack:
        y = _weight_of(sender, payload, positive=True)
        edge = self._in.get(sender)
        last_seq, base_seq = (edge.last_seq, edge.base_seq) if edge else (0, 0)
        check_sequence(sender, payload.seq, last_seq if edge else None)  # (a stale one passes)
        where = placement(sender, payload.seq, payload.base_seq, held=edge is not None,
                          last_seq=last_seq, held_base=base_seq)  # fmt: skip
        if where is Placement.STALE:
            return Ack(last_seq, base_seq, absorbed=False)
        vector = self._received_vector(sender, payload)
        check_message(vector, y, sender)
        # The pending mass after this message, computed before anything changes (in the order
        # the in-place update always used, so that results do not move by a bit).
        pending_x = self._pending_x + vector
        if where is Placement.REPLACES and edge is not None:
            pending_x.sub_(edge.rho_x)
        pending_y = pending_weight(self._pending_y, y, edge.rho_y if edge else 0.0, where)
        if not absorbs(pending_y, self._pending_y):
            return Ack(last_seq, base_seq, absorbed=False)
        self._check_pending(sender, pending_x, pending_y)
        self._pending_x, self._pending_y = pending_x, pending_y
        if edge is None:
            edge = self._in[sender] = _InEdge(torch.zeros_like(self._x))
        edge.rho_x, edge.rho_y = vector, y
        edge.last_seq, edge.base_seq = payload.seq, payload.base_seq
        return Ack(edge.last_seq, edge.base_seq, absorbed=True)

    def out_edge_sum(self, peer: str) -> tuple[torch.Tensor, float, int]:
        """``(sigma_x, sigma_y, base_seq)``: what was given to ``peer`` since ``base_seq``."""
        edge = self._out.get(peer)
        if edge is None:
            return torch.zeros_like(self._x), 0.0, 0
        return edge.sigma_x.clone(), edge.sigma_y, edge.base_seq

    def in_edge_sum(self, sender: str) -> tuple[torch.Tensor, float, int]:
        """``(rho_x, rho_y, base_seq)``: what was absorbed from ``sender`` since ``base_seq``."""
        edge = self._in.get(sender)
        if edge is None:
            return torch.zeros_like(self._x), 0.0, 0
        return edge.rho_x.clone(), edge.rho_y, edge.base_seq


class PlainPushSum(PushSumCore):
    """Textbook push-sum: each message carries this round's share; a lost message is lost mass.

    Kept for comparison: under message loss it converges to the wrong value.
    """

    name = "push-sum-plain"

    def share(self, phase: Phase, ready: Collection[str]) -> dict[str, Payload]:
        # A share the agent cannot send (edge busy) stays home instead of vanishing.
        keep = phase.self_weight + sum(w for p, w in phase.out_weights.items() if p not in ready)
        payloads = {}
        for peer, weight in phase.out_weights.items():
            if peer in ready:
                encoded, decoded = self.encode(self._x * weight, peer)
                payloads[peer] = Payload(decoded, {"y": self._y * weight}, 0, 0, encoded=encoded)
        self._x.mul_(keep)
        self._y *= keep
        return payloads

    def receive(self, sender: str, payload: Payload) -> Ack:
        # Zero is a probe's weight (a share kept home); each message is absorbed as it comes.
        y = _weight_of(sender, payload, positive=False)
        vector = self._received_vector(sender, payload)
        check_message(vector, y, sender)
        pending_x = self._pending_x + vector
        pending_y = self._pending_y + y
        self._check_pending(sender, pending_x, pending_y)
        self._pending_x, self._pending_y = pending_x, pending_y
        return Ack(payload.seq, 0, absorbed=True)
