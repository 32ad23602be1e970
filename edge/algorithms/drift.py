"""A budget on how far one in-neighbour may move an agent over a whole run, not per message.

Per-message clipping (:mod:`airgossip.edge.algorithms.clipping`) bounds one round's pull. An insider
that stays inside the radius, sending each receiver its own estimate plus a small step in
one fixed direction, moves it by that step every round: each message is small, the sum over
rounds is not. :class:`DriftGuard` keeps, per sender ``s``, the *net displacement*
``C_s``, the vector sum of what ``s``'s absorbed messages added to the agent's estimate over
the run, and holds its norm within a budget set by the other in-neighbours:

    || C_s || <= kappa * ref_s,   ref_s = the (b + 1)-th largest || C_k || over k != s

with ``b`` the most insiders the agent expects (``byzantine``) and ``kappa`` the budget
(``drift_budget``). Up to ``b`` senders can hold the others' reference up only by standing
out themselves, so with ``b`` insiders among the in-neighbours the reference is an honest
in-neighbour's net displacement or less. A round's increment of ``s`` that would carry
``C_s`` past its budget is scaled down to the budget's edge (only its part that moves
``C_s`` back is let through once ``C_s`` is beyond a budget that fell); the algorithm
decides what happens to the cut part (robust-push-sum holds it back as it holds back
clipped mass; the model-averaging algorithms drop it).

Honest in-neighbours' pulls change direction as the fleet mixes: their net displacements
stay of the order of the honest spread each brought in, and they meet the budget only when
one honest in-neighbour's net pull is ``kappa`` times that of the ``b + 1``-th largest other.
A drifter's net displacement grows by its step every round until the budget holds it.

**Telling the drifter apart** (:meth:`DriftGuard.observe`). The budget's own ratio
``|| C_s || / ref_s`` is no evidence: the drifter's sits at ``kappa`` once held, and honest
in-neighbours that relay its push (they were moved first) reach it too. What only the source
does is *keep offering* a displacement of the same direction and size while the fleet
agrees: a relay's offers shrink with the agent's own distance to it once the budget holds the
drift, the drifter's never do. Per sender, before any clipping or budget, the guard keeps an
exponential mean (weight :data:`PERSISTENCE` a round) of the displacement ``d_s`` its offer
proposes (its value minus the agent's estimate) and of the round's *typical* displacement,
the median ``|| d_k ||`` over the other senders heard (at least two), floored at
:data:`FLOOR` times the agent's estimate's norm (differences below that are no evidence):

    score_s = || mean(d_s) || / mean(typical)

Directions that change cancel in the numerator; sizes of the order of the other senders'
give about 1. An honest in-neighbour scores at most its distance in multiples of the
typical one (1 to 3 measured); a drifter that adds 0.1 of the estimate's norm each round
scores ``0.1 || z ||`` over a typical displacement that falls as the fleet agrees, tens within
some tens of rounds. The score is
exported as ``airgossip_agent_in_neighbour_drift_score`` and read by the alert rules
(deploy/prometheus/alerts.yml), which also ask that the peer be the top-scored in-neighbour
of two credible agents.

With fewer than two in-neighbours there is nothing to compare with: no budget (``inf``) and
no score.
Pure tensors in, factors and scores out; no I/O.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch

#: Below this a reference counts as zero (no sender has moved the agent yet).
TINY = 1e-300
#: Weight of a round in the drift score's exponential means (a horizon of about 20 rounds).
PERSISTENCE = 0.05
#: Displacements under this fraction of the agent's estimate's norm are no evidence: the floor
#: of the typical displacement (an agreed fleet's rounding noise never scores).
FLOOR = 1e-3


class DriftGuard:
    """Net displacement per sender, and the factor that keeps each within its budget.

    Parameters
    ----------
    budget:
        ``kappa``: the most net displacement of one sender, in multiples of the reference.
    byzantine:
        ``b``: how many of the largest other senders the reference skips.
    """

    def __init__(self, budget: float, byzantine: int) -> None:
        if not budget > 0:
            raise ValueError(f"drift budget must be positive, got {budget}")
        if byzantine < 0:
            raise ValueError(f"byzantine must be 0 or more, got {byzantine}")
        self.budget = float(budget)
        self.byzantine = int(byzantine)
        #: ``C_s`` per sender.
        self.net: dict[str, torch.Tensor] = {}
        #: ``|| C_s || / ref_s`` per sender after the last :meth:`limit` (0 without a reference).
        self.spent: dict[str, float] = {}
        #: The drift score per sender (:meth:`observe`), exported.
        self.score: dict[str, float] = {}
        #: Exponential means of each sender's offered displacement and of the typical one.
        self._lean: dict[str, torch.Tensor] = {}
        self._typical: dict[str, float] = {}
        #: Rounds in which the budget cut each sender's increment.
        self.held_by_sender: dict[str, int] = {}

    def reference(self, sender: str, norms: dict[str, float]) -> float:
        """``ref_s``: the ``b + 1``-th largest of the other senders' norms (``inf`` alone)."""
        others = sorted((n for s, n in norms.items() if s != sender), reverse=True)
        if not others:
            return math.inf
        return others[min(self.byzantine, len(others) - 1)]

    def limit(self, deltas: dict[str, torch.Tensor]) -> dict[str, float]:
        """The factor in ``[0, 1]`` for each sender's displacement of this round, ``deltas``
        (what its increment would add to the agent's estimate), so that its net displacement
        stays within budget; the net displacements are advanced by the scaled deltas."""
        for sender, delta in deltas.items():
            if sender not in self.net:
                self.net[sender] = torch.zeros_like(delta)
        tentative = {
            s: float(torch.linalg.vector_norm(self.net[s] + deltas.get(s, 0.0))) for s in self.net
        }
        factors: dict[str, float] = {}
        for sender, delta in deltas.items():
            ref = self.reference(sender, tentative)
            cap = self.budget * ref
            factor = _largest_step(self.net[sender], delta, cap)
            if factor < 1.0:
                self.held_by_sender[sender] = self.held_by_sender.get(sender, 0) + 1
            factors[sender] = factor
            if factor > 0.0:
                self.net[sender] = self.net[sender] + delta * factor
        for sender, net in self.net.items():
            ref = self.reference(sender, tentative)
            norm = float(torch.linalg.vector_norm(net))
            self.spent[sender] = 0.0 if not math.isfinite(ref) or ref <= TINY else norm / ref
        return factors

    def observe(self, offered: dict[str, torch.Tensor], own_norm: float) -> None:
        """Advance the drift scores with this round's ``offered`` displacements (each sender's
        proposed value minus the agent's estimate, before any clipping or budget) of the
        senders heard; ``own_norm``: the norm of the agent's estimate."""
        norms = {s: float(torch.linalg.vector_norm(d)) for s, d in offered.items()}
        floor = FLOOR * own_norm
        for sender, delta in offered.items():
            others = sorted(n for s, n in norms.items() if s != sender)
            if len(others) < 2 or not math.isfinite(norms[sender]):
                continue
            median = statistics.median(others)
            typical = max(median, floor)
            if not math.isfinite(typical) or typical <= TINY:
                continue
            lean = self._lean.get(sender)
            if lean is None:
                self._lean[sender] = delta * PERSISTENCE
                self._typical[sender] = typical * PERSISTENCE
            else:
                self._lean[sender] = lean * (1.0 - PERSISTENCE) + delta * PERSISTENCE
                self._typical[sender] = (
                    self._typical[sender] * (1.0 - PERSISTENCE) + typical * PERSISTENCE
                )
            self.score[sender] = (
                float(torch.linalg.vector_norm(self._lean[sender])) / self._typical[sender]
            )

    def forget(self, keep: set[str]) -> None:
        """Drop the senders not in ``keep`` (no longer in-neighbours)."""
        tables: tuple[dict[str, Any], ...] = (
            self.net, self.spent, self.score, self.held_by_sender, self._lean, self._typical
        )  # fmt: skip
        for table in tables:
            for sender in [s for s in table if s not in keep]:
                del table[sender]

    def state_dict(self) -> dict[str, object]:
        return {
            "net": {s: c.clone() for s, c in self.net.items()},
            "lean": {s: c.clone() for s, c in self._lean.items()},
            "typical": dict(self._typical),
        }

    def load_state_dict(self, state: dict[str, object], dtype: torch.dtype) -> None:
        net = state.get("net", {})
        assert isinstance(net, dict)
        self.net = {str(s): c.to(dtype).clone() for s, c in net.items()}
        lean = state.get("lean", {})
        typical = state.get("typical", {})
        assert isinstance(lean, dict) and isinstance(typical, dict)
        # A sender whose figures are not finite starts afresh (a score is evidence, never NaN).
        self._lean = {
            str(s): c.to(dtype).clone() for s, c in lean.items() if bool(torch.isfinite(c).all())
        }
        self._typical = {
            str(s): float(t)
            for s, t in typical.items()
            if str(s) in self._lean and math.isfinite(float(t)) and float(t) > 0
        }
        self._lean = {s: c for s, c in self._lean.items() if s in self._typical}
        for sender, c in self._lean.items():
            if self._typical[sender] > TINY:
                self.score[sender] = float(torch.linalg.vector_norm(c)) / self._typical[sender]


def _largest_step(net: torch.Tensor, delta: torch.Tensor, cap: float) -> float:
    """The largest ``f`` in ``[0, 1]`` with ``|| net + f delta || <= max(cap, || net ||)``
    when ``net`` is within ``cap``, else with ``|| net + f delta || <= || net ||``."""
    if math.isinf(cap):
        return 1.0
    dd = float(torch.dot(delta.flatten(), delta.flatten()))
    if dd == 0.0:
        return 1.0
    nd = float(torch.dot(net.flatten(), delta.flatten()))
    nn = float(torch.dot(net.flatten(), net.flatten()))
    radius2 = max(cap * cap, nn)
    if nn + 2.0 * nd + dd <= radius2:
        return 1.0
    # || net + f delta ||^2 = nn + 2 f nd + f^2 dd <= radius2: the larger root of the quadratic.
    disc = nd * nd - dd * (nn - radius2)
    if disc < 0.0:
        return 0.0
    root = (-nd + math.sqrt(disc)) / dd
    return min(1.0, max(0.0, root))
