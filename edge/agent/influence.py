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

Each message is also judged as it comes, against the receiver's other in-neighbours
(:class:`OutlierOnsets`): when an in-neighbour's messages begin to move the agent over ten
times as far as its other in-neighbours' typically do, the agent notes the time, by its own
clock. A forgery reaches its victims first and honest agents that pass it on only later, so
the onsets put a fleet's accusations in causal order (deploy/prometheus/alerts.yml).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

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


#: A message is an outlier when its relative increment is over this many times the typical
#: increment of the receiver's other in-neighbours (the median of their typical values)...
ONSET_FACTOR = 10.0
#: ... and over this much of the receiver's own norm (near consensus honest increments are
#: tiny, and ten times tiny is no evidence).
ONSET_FLOOR = 0.5
#: Weight of each message in its sender's typical increment, a moving average of the
#: logarithm: a forged message a thousand times the typical moves it by a factor of
#: 1000 ** 0.1 = 2, and about twenty messages at a new level make that level the typical.
TYPICAL_WEIGHT = 0.1
#: Messages of an in-neighbour before its typical value judges the others' messages.
TYPICAL_AFTER = 3
#: Other in-neighbours with a typical value a judgement needs (with one, its typical value is
#: the whole baseline).
BASELINE_PEERS = 2
#: An outlier episode ends this long after the last outlier message (seconds: the alert
#: rules' one-minute window).
EPISODE_S = 60.0
#: Increments under this count as this much in the typical values (an exact consensus's zeros
#: would otherwise pin the average at minus infinity).
TYPICAL_FLOOR = 1e-12


class OutlierOnsets:
    """When each in-neighbour's current run of outlier messages began, by this agent's clock.

    A message of ``sender`` is an outlier when its relative increment exceeds both
    :data:`ONSET_FLOOR` and :data:`ONSET_FACTOR` times the median typical increment of the
    agent's other in-neighbours (:data:`BASELINE_PEERS` of them or more, each with
    :data:`TYPICAL_AFTER` messages or more). The first outlier starts an episode at the time of
    ``clock``; it lasts until :data:`EPISODE_S` pass without one. The baseline is each peer's
    moving average taken before the message, so the first forged message is judged against
    honest values, before the forgery reaches the agent through anyone else.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._typical: dict[str, tuple[float, int]] = {}  # log typical increment, messages
        self._onset: dict[str, float] = {}
        self._last: dict[str, float] = {}  # time of the episode's latest outlier

    def forget(self, peers: frozenset[str]) -> None:
        """Keep the figures of ``peers`` only."""
        for table in (self._typical, self._onset, self._last):
            for peer in [p for p in table if p not in peers]:
                del table[peer]

    def observe(self, sender: str, increment: float) -> float:
        """Judge one absorbed message of ``sender``; returns when its current episode began
        (seconds of ``clock``), or 0.0 when it is in none."""
        now = self.clock()
        others = [v for p, (v, n) in self._typical.items() if p != sender and n >= TYPICAL_AFTER]
        if len(others) >= BASELINE_PEERS:
            baseline = math.exp(statistics.median(others))
            if increment > ONSET_FLOOR and increment > ONSET_FACTOR * baseline:
                self._onset.setdefault(sender, now)
                self._last[sender] = now
        if sender in self._onset and now - self._last[sender] > EPISODE_S:
            del self._onset[sender], self._last[sender]
        level = math.log(max(increment, TYPICAL_FLOOR))
        typical, count = self._typical.get(sender, (level, 0))
        self._typical[sender] = (typical + TYPICAL_WEIGHT * (level - typical), count + 1)
        return self._onset.get(sender, 0.0)


class InNeighbourWatch:
    """One agent's per-in-neighbour figures for its observer: the relative increment of each
    absorbed message, when the sender's current run of outlier messages began
    (:class:`OutlierOnsets`), and the algorithm's clip events (``clipped_by_sender``, a counter
    per sender, on algorithms that clip), for current in-neighbours only. Not thread-safe: the
    agent calls it under its lock."""

    def __init__(
        self,
        algorithm: GossipAlgorithm,
        observer: object | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.algorithm = algorithm
        self.observer = observer
        self.in_neighbours: frozenset[str] = frozenset()
        self.onsets = OutlierOnsets(clock)
        self._clips: dict[str, int] = {}  # clip events of each sender seen so far

    def set_in_neighbours(self, peers: frozenset[str]) -> None:
        """The current in-neighbours: figures of the others are forgotten (here and by an
        observer with ``on_in_neighbours``)."""
        self.in_neighbours = peers
        self._clips = {p: n for p, n in self._clips.items() if p in peers}
        self.onsets.forget(peers)
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
        increment = onset = None
        if absorbed and (before is not None or not isinstance(self.algorithm, PushSumCore)):
            increment = relative_increment(self.algorithm, before, payload)
            onset = self.onsets.observe(sender, increment)
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
            onset=onset,
            clipped=clipped,
            drift=drift,
        )
