"""How far each absorbed message moves an agent: the *relative increment*, per in-neighbour.

An insider with a valid certificate can push finite, well-formed messages that carry a value
far from anything its honest peers hold. Nothing refuses them; what gives them away is how
far they move the receiver compared with what its other in-neighbours' messages do. This
module measures one number per absorbed message, comparable across algorithms and fleets:

    relative increment = || v - z || / || z ||

with ``z`` the receiver's own de-biased estimate before the message and ``v`` the value the
absorbed message proposes:

* algorithms that carry a weight (push-sum and its variants, gradient tracking, local SGD,
  the shared-copy algorithms): ``v = dx / dy``, where ``(dx, dy)`` is the mass the message
  added to what the receiver holds (for push-sum: the increment of the edge's running
  sum). When a message adds no weight
  (``dy <= 0``) the figure is ``|| dx || / || x ||``, the mass it moved against the mass held;
* algorithms that exchange models (D-PSGD, ensemble compression): ``v`` is the model the
  message carries.

An honest in-neighbour's increment shrinks as the fleet nears consensus (and is of order 1 at
the start of a consensus run from random values); a forged push of values a thousand times
the fleet's proposes ``v`` a thousand times ``z``. The cost is one temporary vector and two
norms per absorbed message: the measure holds references to the state before the message,
never a copy (the algorithms replace their pending mass on absorption).

An algorithm that leaves its pending mass as it was (``robust-push-sum`` holds each sender's
increments apart until the mix, where it clips them) is measured by the payload itself:
``v = vector / y``, the value the edge's running sum proposes, before any clipping. The
clip events (``clipped_by_sender``, counted at the mix) and, on algorithms with a drift
budget, the sender's drift score (``drift_by_sender``, :mod:`airgossip.edge.algorithms.drift`) reach
the observer with the sender's next message.
"""

from __future__ import annotations

import torch

from airgossip.edge.algorithms import GossipAlgorithm, Payload
from airgossip.edge.algorithms.push_sum import PushSumCore
from airgossip.edge.observability.telemetry import ReceiveEvent

#: Below this norm an estimate counts as zero (the ratio is then taken against 1).
TINY = 1e-30

#: What :func:`held` returns: references to the pending mass before a message (no copies).
Held = tuple[torch.Tensor, float] | None


def held(algorithm: GossipAlgorithm) -> Held:
    """References to the mass ``algorithm`` holds pending before a message (None for
    algorithms that carry no weight)."""
    if isinstance(algorithm, PushSumCore):
        return algorithm._pending_x, algorithm._pending_y
    return None


def relative_increment(algorithm: GossipAlgorithm, before: Held, payload: Payload) -> float:
    """The relative increment of ``payload``, just absorbed by ``algorithm``, whose pending
    mass before it was ``before`` (:func:`held`, taken under the same lock)."""
    if isinstance(algorithm, PushSumCore) and before is not None:
        return _weighted(algorithm, before, payload)
    own = algorithm.estimate()
    return _ratio(float(torch.dist(payload.vector.to(own.dtype), own)), own)


def _weighted(algorithm: PushSumCore, before: Held, payload: Payload) -> float:
    assert before is not None
    pending_x, pending_y = before
    x, y = algorithm.x, algorithm.y
    if algorithm._pending_x is pending_x:  # held elsewhere until the mix: what the payload carries
        dy = float(payload.scalars.get("y", 0.0))
        dx = payload.vector.to(x.dtype)
        if dx.numel() != x.numel():  # several blocks (shared-copy): nothing to compare
            return 0.0
        dx = dx.clone()
    else:
        dy = algorithm._pending_y - pending_y
        dx = algorithm._pending_x - pending_x  # the one temporary
    if dy <= 0.0:
        return _ratio(float(torch.linalg.vector_norm(dx)), x)
    # || dx / dy - x / y || / || x / y || = || dx - (dy / y) x || y / (dy || x ||), computed
    # in place on the temporary.
    distance = float(torch.linalg.vector_norm(dx.sub_(x, alpha=dy / y)))
    return distance * y / (dy * max(float(torch.linalg.vector_norm(x)), TINY))


def _ratio(distance: float, own: torch.Tensor) -> float:
    return distance / max(float(torch.linalg.vector_norm(own)), TINY)


class InNeighbourWatch:
    """One agent's per-in-neighbour figures for its observer: the relative increment of each
    absorbed message and the algorithm's clip events (``clipped_by_sender``, a counter per
    sender, on algorithms that clip), for current in-neighbours only. Not thread-safe: the
    agent calls it under its lock."""

    def __init__(self, algorithm: GossipAlgorithm, observer: object | None) -> None:
        self.algorithm = algorithm
        self.observer = observer
        self.in_neighbours: frozenset[str] = frozenset()
        self._clips: dict[str, int] = {}  # clip events of each sender seen so far

    def set_in_neighbours(self, peers: frozenset[str]) -> None:
        """The current in-neighbours: figures of the others are forgotten (here and by an
        observer with ``on_in_neighbours``)."""
        self.in_neighbours = peers
        self._clips = {p: n for p, n in self._clips.items() if p in peers}
        forget = getattr(self.observer, "on_in_neighbours", None)
        if forget is not None:
            forget(peers)

    def before(self, sender: str) -> Held:
        """What :meth:`received` needs of the state before ``sender``'s message."""
        if self.observer is None or sender not in self.in_neighbours:
            return None
        return held(self.algorithm)

    def received(
        self, sender: str, payload: Payload, payload_bytes: int, absorbed: bool, before: Held
    ) -> ReceiveEvent:
        """The event of ``sender``'s accepted message (``absorbed``: it moved the state)."""
        if sender not in self.in_neighbours:
            return ReceiveEvent(True, sender, payload_bytes=payload_bytes)
        increment = None
        if absorbed and (before is not None or not isinstance(self.algorithm, PushSumCore)):
            increment = relative_increment(self.algorithm, before, payload)
        counts = getattr(self.algorithm, "clipped_by_sender", None)
        clipped = 0
        if counts is not None:
            total = int(counts.get(sender, 0))
            clipped = max(0, total - self._clips.get(sender, 0))
            self._clips[sender] = total
        scores = getattr(self.algorithm, "drift_by_sender", None)
        drift = None if scores is None or sender not in scores else float(scores[sender])
        return ReceiveEvent(
            True,
            sender,
            payload_bytes=payload_bytes,
            increment=increment,
            clipped=clipped,
            drift=drift,
        )
