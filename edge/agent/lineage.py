"""Which history each edge's messages belong to, so that a restarted agent never mixes its
edges' past with what its peers hold now.

Algorithms with per-edge history (push-sum's running sums, shared copies, sequence numbers)
are exact under loss only while both ends of an edge remember the same history. An agent
that restarts (from a checkpoint of any age, or from none) has lost its side of it, so it
starts every edge over: each agent process has an *incarnation* (when it started, in
milliseconds, made larger than any it recorded before), and each out-edge a *lineage*, first
``incarnation << 20``. Every message carries its edge's lineage:

- a receiver that sees a larger lineage than it holds forgets the edge
  (``GossipAlgorithm.forget_in_edge``) and starts it from that message, which must be
  measured from nothing (``base_seq`` 0);
- a receiver that cannot place a message (a smaller lineage, a new one not measured from
  nothing, or state the algorithm cannot continue) absorbs nothing and answers
  ``start_over``; the sender then starts a new lineage above both and has the algorithm
  send everything the receiver has not acknowledged, measured from nothing
  (``GossipAlgorithm.restart_out_edge``).

In-process fleets, whose agents never restart, keep incarnation 0: lineage 0 on every edge,
nothing on the wire.
"""

from __future__ import annotations

import enum
import time

from airgossip.edge.algorithms import Ack, GossipAlgorithm, Payload, ProtocolError

#: Lineages of one incarnation: ``incarnation << LINEAGE_BITS`` and up.
LINEAGE_BITS = 20


def new_incarnation(previous: int = 0, *, now_ms: int | None = None) -> int:
    """An incarnation for an agent process starting now: its start in milliseconds since the
    Unix epoch, and larger than ``previous`` (the one its checkpoint recorded) even when the
    clock went back."""
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    return max(now_ms, previous + 1)


class Verdict(enum.Enum):
    """What a receiver makes of a message's lineage."""

    #: The lineage the receiver holds: the algorithm takes it.
    CONTINUE = "continue"
    #: A newer lineage, measured from nothing: forget the edge, then the algorithm takes it.
    NEW = "new"
    #: Cannot be placed: absorb nothing, answer ``start_over``.
    START_OVER = "start_over"


class EdgeLineages:
    """One agent's lineages: of its out-edges (what it sends) and in-edges (what it holds).

    Not thread-safe: the agent calls it under its lock.
    """

    def __init__(self, incarnation: int = 0) -> None:
        self.incarnation = incarnation
        self._out: dict[str, int] = {}
        self._in: dict[str, int] = {}

    def restart(self, incarnation: int) -> None:
        """This agent starts over as ``incarnation``: every edge starts a new lineage."""
        self.incarnation = incarnation
        self._out.clear()
        self._in.clear()

    # -- sending -----------------------------------------------------------------------------
    def outgoing(self, peer: str) -> int:
        """The lineage of the edge to ``peer``."""
        lineage = self._out.get(peer)
        if lineage is None:
            lineage = self._out[peer] = self.incarnation << LINEAGE_BITS
        return lineage

    def start_over(self, peer: str, held: int = 0) -> int:
        """Start a new lineage of the edge to ``peer``, above ours and the ``held`` one the
        receiver reported; return it."""
        lineage = self._out[peer] = max(self.outgoing(peer), held) + 1
        return lineage

    # -- receiving ---------------------------------------------------------------------------
    def incoming(self, sender: str) -> int:
        """The lineage held of the edge from ``sender`` (0: none yet)."""
        return self._in.get(sender, 0)

    def admit(self, sender: str, lineage: int, base_seq: int) -> Verdict:
        """What to make of a message of ``lineage`` measured from ``base_seq``; a NEW
        lineage is recorded as held (the caller forgets the edge's old state)."""
        held = self._in.get(sender)
        if held is not None and lineage == held:
            return Verdict.CONTINUE
        if (held is None or lineage > held) and base_seq == 0:
            self._in[sender] = lineage
            return Verdict.NEW
        return Verdict.START_OVER

    # -- with an algorithm -------------------------------------------------------------------
    def receive(
        self, algorithm: GossipAlgorithm, sender: str, lineage: int, payload: Payload
    ) -> tuple[Ack | None, str]:
        """Hand ``payload`` of ``lineage`` from ``sender`` to ``algorithm``, forgetting the
        edge first when the lineage is new: ``(its ack, "")``, or ``(None, why)`` when the
        message cannot be placed and the sender must start over. ``InvalidPayload`` passes."""
        verdict = self.admit(sender, lineage, payload.base_seq)
        if verdict is Verdict.START_OVER:
            return None, f"lineage {lineage} measured from {payload.base_seq}"
        if verdict is Verdict.NEW:
            algorithm.forget_in_edge(sender)
        try:
            return algorithm.receive(sender, payload), ""
        except ProtocolError as err:
            return None, str(err)

    def acknowledged(self, algorithm: GossipAlgorithm, peer: str, ack: Ack) -> int | None:
        """Hand ``peer``'s ``ack`` to ``algorithm``, or, when it says ``start_over``, start a
        new lineage of the edge and have the algorithm start its edge over: then return the
        lineage ``peer`` held (larger than ours: another process may run as this agent)."""
        if not ack.start_over:
            algorithm.on_ack(peer, ack)
            return None
        ours = self.outgoing(peer)
        self.start_over(peer, ack.lineage)
        algorithm.restart_out_edge(peer)
        return ack.lineage if ack.lineage > ours else 0
