"""Where an agent that starts while its fleet is under way (a restart) takes up its rounds.

A restarted agent's round is its checkpoint's (or 0); its fleet went on. It skips ahead to
the fleet's round, as its coordinator says (``GetRun``) or as its peers name theirs in
messages and acknowledgements (the median: one peer cannot move it), when the fleet is
well ahead; it does not join a fleet in its last rounds (nothing left to learn from it).
"""

from __future__ import annotations

#: The fleet must be more than this many rounds (beyond the staleness bound) ahead for an
#: agent to skip ahead; it is not joined in its last this-many rounds either.
REJOIN_GAP_ROUNDS = 8
#: The weight an agent that joins a fleet under way without a checkpoint starts with (an
#: agent starts with 1): its fresh state, the task's initial one, must not pull its
#: neighbours back, and its data already went into the fleet before it lost its state.
LATE_WEIGHT = 1e-3
#: How long an agent that has heard from no peer after its first round waits to hear one
#: before it goes on alone (its out-neighbours are gone, say, and in-neighbours not yet back).
REJOIN_WAIT_S = 5.0


def fleet_round(peer_rounds: list[int]) -> int | None:
    """The round a fleet is at, from the latest rounds its peers named (None: none heard)."""
    if not peer_rounds:
        return None
    ordered = sorted(peer_rounds)
    return ordered[len(ordered) // 2]


def rejoin_round(own: int, fleet: int, *, rounds: int, staleness: int) -> int | None:
    """The round an agent at ``own`` skips to when its fleet is at ``fleet`` (None: it stays):
    the fleet's, when that is more than :data:`REJOIN_GAP_ROUNDS` beyond the staleness bound
    ahead and not in the run's last :data:`REJOIN_GAP_ROUNDS` of ``rounds``."""
    if fleet > rounds - REJOIN_GAP_ROUNDS:
        return None
    if fleet - own > staleness + REJOIN_GAP_ROUNDS:
        return fleet
    return None
