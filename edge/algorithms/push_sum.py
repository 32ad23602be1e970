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

from edge.algorithms.base import (
    SEQ_SLACK,
    Ack,
    GossipAlgorithm,
    InvalidPayload,
    Payload,
    ProtocolError,
    check_absorption,
    check_message,
    check_sequence,
    check_weight,
    refuse_amplifying_codec,
)
from edge.compression import Codec
from edge.topology.mixing import Phase


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

    def mass(self) -> tuple[torch.Tensor, float]:
        """``(x, y)`` held by this agent, received-but-unmixed mass included."""
        return self._x + self._pending_x, self._y + self._pending_y

    def _check_pending(self, sender: str, pending_x: torch.Tensor, pending_y: float) -> None:
        """Refuse (:class:`InvalidPayload`) unless the state after mixing ``pending`` in is
        one an agent may hold (see :func:`check_absorption`); changes nothing."""
        check_absorption(self._x + pending_x, self._y + pending_y, sender)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "x": self._x.clone(),
            "y": self._y,
            "pending_x": self._pending_x.clone(),
            "pending_y": self._pending_y,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._x = state["x"].to(self.dtype).clone()
        self._y = float(state["y"])
        self._pending_x = state["pending_x"].to(self.dtype).clone()
        self._pending_y = float(state["pending_y"])

    def _received_vector(self, sender: str, payload: Payload) -> torch.Tensor:
        if payload.vector.numel() != self._x.numel():
            raise InvalidPayload(
                f"{self.name} message from '{sender}' holds {payload.vector.numel()} elements, "
                f"expected {self._x.numel()}"
            )
        vector = payload.vector
        return vector if vector.dtype == self.dtype else vector.to(self.dtype)


#: Recent messages per out-edge a checkpointing sender remembers, so that it can measure from
#: whichever of them the receiver's next checkpoint holds.
SENT_HISTORY = 8
#: Durable points per in-edge a checkpointing receiver keeps (see :class:`_InEdge`).
DURABLE_POINTS = 8


@dataclass
class _OutEdge:
    sigma_x: torch.Tensor  # everything given to this edge since `base_seq`
    sigma_y: float = 0.0
    seq: int = 0
    base_seq: int = 0
    acked: int = 0  # the highest seq the receiver reported holding
    #: What recent messages carried, by seq, measured from `base_seq` (decoded: exactly what
    #: the receiver holds once it absorbs that message).
    sent: dict[int, tuple[torch.Tensor, float]] = field(default_factory=dict)
    #: A message the receiver's checkpoint holds, to measure from once ours does too.
    rebase: tuple[int, torch.Tensor, float] | None = None
    #: Restored from a checkpoint and not yet heard from the receiver: it may hold other
    #: contents under the seqs this edge is about to reuse.
    resumed: bool = False


@dataclass
class _InEdge:
    rho_x: torch.Tensor  # the sender's running sum as of `last_seq`, measured from `base_seq`
    rho_y: float = 0.0
    last_seq: int = 0
    base_seq: int = 0
    #: Durable points, oldest first: (seq, rho_x, rho_y) as of a message a checkpoint holds,
    #: measured from `base_seq`. A sender may re-measure its sums from any of them. Without
    #: checkpoints the one point is the last message itself.
    points: list[tuple[int, torch.Tensor, float]] = field(default_factory=list)

    @property
    def durable_seq(self) -> int:
        return max(self.base_seq, self.points[-1][0]) if self.points else self.base_seq

    def point(self, seq: int) -> tuple[int, torch.Tensor, float] | None:
        return next((p for p in self.points if p[0] == seq), None)


class PushSum(PushSumCore):
    """Push-sum with running sums per edge: exact under loss, duplication and reordering.

    **Checkpoints.** Running sums make a rollback of either end safe, with two rules. A
    receiver acknowledges as durable only messages its last checkpoint holds, and keeps its
    sum as of each such point; a sender re-measures its sums from such a point (forgetting
    what it sent up to there) only in a checkpoint of its own, and numbers its messages past
    whatever the receiver reports holding after a restart. A receiver rolled back then gets
    everything since its checkpoint again with the next sum; a sender rolled back sends sums
    whose difference to what the receiver absorbed corrects what it had sent twice.
    """

    name = "push-sum"

    @classmethod
    def check_codec(cls, codec: Codec) -> None:
        refuse_amplifying_codec(cls.name, codec)

    def __init__(self, initial: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(initial, **kwargs)
        self._out: dict[str, _OutEdge] = {}
        self._in: dict[str, _InEdge] = {}
        #: The re-measurements the last state_dict() wrote, applied when it is committed.
        self._written_rebases: dict[str, tuple[int, torch.Tensor, float]] = {}

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
            if peer not in phase.out_weights and edge.sigma_y == 0.0:
                continue  # off this phase and nothing undelivered: no message
            # An edge off this phase (the graph changed, or a periodic graph) that still holds
            # undelivered weight flushes it as soon as it can, instead of stranding it.
            encoded, decoded = self.encode(edge.sigma_x, peer)
            if edge.seq - edge.acked < SEQ_SLACK:
                edge.seq += 1
                if not self.checkpointing:
                    edge.sent.clear()  # only the latest message can be the receiver's last
                edge.sent[edge.seq] = (decoded, edge.sigma_y)
                while len(edge.sent) > SENT_HISTORY:
                    del edge.sent[min(edge.sent)]
            else:
                # Far past anything acknowledged (a dead peer, probed): the number is reused,
                # and the receiver may hold either content under it.
                edge.sent.pop(edge.seq, None)
            payloads[peer] = Payload(
                decoded, {"y": edge.sigma_y}, edge.seq, edge.base_seq, encoded=encoded
            )
        return payloads

    def on_ack(self, peer: str, ack: Ack) -> None:
        edge = self._out.get(peer)
        if edge is None:
            return
        edge.acked = max(edge.acked, ack.last_seq)
        if edge.resumed or ack.last_seq > edge.seq:
            # The receiver heard from this edge before our restart: its seqs up to last_seq
            # may hold other contents than ours. Never measure from them; number past them.
            edge.resumed = False
            edge.seq = max(edge.seq, ack.last_seq)
            edge.sent = {s: v for s, v in edge.sent.items() if s > ack.last_seq}
        sent = edge.sent.get(ack.durable)
        if sent is None or ack.durable <= edge.base_seq:
            return  # nothing we can measure from
        # The receiver's sum is now exactly what it decoded: measure from there on both sides
        # (with checkpoints, once our next one holds it: see committed()).
        edge.rebase = (ack.durable, *sent)
        if not self.checkpointing:
            self._rebase(edge, edge.rebase)

    @staticmethod
    def _rebase(edge: _OutEdge, rebase: tuple[int, torch.Tensor, float]) -> None:
        """Measure the edge's sums from the message ``rebase`` names, which the receiver holds."""
        seq, x, y = rebase
        if seq <= edge.base_seq:
            return
        edge.sigma_x.sub_(x)
        edge.sigma_y -= y
        edge.base_seq = seq
        edge.sent = {s: (sx - x, sy - y) for s, (sx, sy) in edge.sent.items() if s > seq}
        later = edge.rebase
        if later is not None and later[0] > seq:
            edge.rebase = (later[0], later[1] - x, later[2] - y)
        else:
            edge.rebase = None

    def on_refused(self, peer: str) -> None:
        edge = self._out.get(peer)
        if edge is None:
            return
        # The receiver lost its edge state (a restart): it gets what is held since our base.
        edge.base_seq = 0
        edge.sent.clear()
        edge.rebase = None

    def receive(self, sender: str, payload: Payload) -> Ack:
        y = _weight_of(sender, payload, positive=True)
        edge = self._in.get(sender)
        last_seq, base_seq = (edge.last_seq, edge.base_seq) if edge else (0, 0)
        if payload.seq <= last_seq:
            return Ack(last_seq, base_seq, absorbed=False, durable_seq=self._durable(edge))
        check_sequence(sender, payload.seq, last_seq if edge else None)
        vector = self._received_vector(sender, payload)
        check_message(vector, y, sender)
        # The pending mass after this message, computed before anything changes (in the order
        # the in-place update always used, so that results do not move by a bit).
        if payload.base_seq == base_seq:
            pending_x = self._pending_x + vector
            if edge is not None:
                pending_x.sub_(edge.rho_x)
            pending_y = self._pending_y + (y - (edge.rho_y if edge else 0.0))
        else:
            point = edge.point(payload.base_seq) if edge is not None else None
            if point is None or payload.base_seq < base_seq:
                raise ProtocolError(
                    f"message seq {payload.seq} from '{sender}' is measured from seq "
                    f"{payload.base_seq}, but this edge is at base {base_seq} after seq "
                    f"{last_seq}"
                )
            assert edge is not None
            if point[0] == last_seq:  # measured from our last message: all of it is new
                pending_x, pending_y = self._pending_x + vector, self._pending_y + y
            else:  # what arrived after that point is already in
                pending_x = self._pending_x + (vector - (edge.rho_x - point[1]))
                pending_y = self._pending_y + (y - (edge.rho_y - point[2]))
        if pending_y < self._pending_y:
            # Less than this edge already brought: the sender resumed from a checkpoint and
            # re-counts what it gave since. Its sums catch up within as many rounds; until
            # then there is nothing new (and taking back weight could sink ours below zero).
            return Ack(last_seq, base_seq, absorbed=False, durable_seq=self._durable(edge))
        self._check_pending(sender, pending_x, pending_y)
        self._pending_x, self._pending_y = pending_x, pending_y
        if edge is None:
            edge = self._in[sender] = _InEdge(torch.zeros_like(self._x))
        if payload.base_seq != edge.base_seq:
            point = edge.point(payload.base_seq)
            assert point is not None
            edge.points = [
                (s, px - point[1], py - point[2]) for s, px, py in edge.points if s > point[0]
            ]
        edge.rho_x, edge.rho_y = vector, y
        edge.last_seq, edge.base_seq = payload.seq, payload.base_seq
        if not self.checkpointing:
            edge.points = [(edge.last_seq, vector, y)]
        return Ack(edge.last_seq, edge.base_seq, absorbed=True, durable_seq=self._durable(edge))

    def _durable(self, edge: _InEdge | None) -> int | None:
        return None if edge is None else edge.durable_seq

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

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out = {}
        self._written_rebases = {}
        for peer, edge in self._out.items():
            sigma_x, sigma_y, base = edge.sigma_x.clone(), edge.sigma_y, edge.base_seq
            if edge.rebase is not None:  # written re-measured; applied once durable
                self._written_rebases[peer] = edge.rebase
                base, x, y = edge.rebase
                sigma_x.sub_(x)
                sigma_y -= y
            out[peer] = {
                "sigma_x": sigma_x, "sigma_y": sigma_y, "seq": edge.seq, "base_seq": base,
                "acked": edge.acked,
            }  # fmt: skip
        incoming = {}
        for sender, in_edge in self._in.items():
            points = [p for p in in_edge.points if p[0] < in_edge.last_seq]
            points.append((in_edge.last_seq, in_edge.rho_x, in_edge.rho_y))
            incoming[sender] = {
                "rho_x": in_edge.rho_x, "rho_y": in_edge.rho_y, "last_seq": in_edge.last_seq,
                "base_seq": in_edge.base_seq,
                "points": [{"seq": s, "x": px, "y": py} for s, px, py in points],
            }  # fmt: skip
        return {**super().state_dict(), "out": out, "in": incoming}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._out = {
            peer: _OutEdge(
                e["sigma_x"].to(self.dtype).clone(), float(e["sigma_y"]), int(e["seq"]),
                int(e["base_seq"]), int(e["acked"]), resumed=True,
            )
            for peer, e in state["out"].items()
        }  # fmt: skip
        self._in = {
            sender: _InEdge(
                e["rho_x"].to(self.dtype), float(e["rho_y"]), int(e["last_seq"]),
                int(e["base_seq"]),
                [(int(p["seq"]), p["x"].to(self.dtype), float(p["y"])) for p in e["points"]],
            )
            for sender, e in state["in"].items()
        }  # fmt: skip

    def committed(self, state: dict[str, Any]) -> None:
        for peer, written in state.get("out", {}).items():
            edge, rebase = self._out.get(peer), self._written_rebases.get(peer)
            if edge is not None and rebase is not None and rebase[0] == written["base_seq"]:
                self._rebase(edge, rebase)
        for sender, written in state.get("in", {}).items():
            in_edge = self._in.get(sender)
            if in_edge is None or in_edge.base_seq != written["base_seq"]:
                continue  # re-measured since: the older point is of no use
            if in_edge.points and in_edge.points[-1][0] >= written["last_seq"]:
                continue
            in_edge.points.append((written["last_seq"], written["rho_x"], written["rho_y"]))
            del in_edge.points[:-DURABLE_POINTS]


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
