"""Where an agent that starts while its fleet is under way (a restart) takes up its rounds.

A restarted agent's round is its checkpoint's (or 0); its fleet went on. It skips ahead to
the fleet's round, as its coordinator says (``GetRun``) or as its peers name theirs in
messages and acknowledgements, when the fleet is well ahead; it does not join a fleet in its
last rounds (nothing left to learn from it).

A round a peer names is only its word: an insider may name any round. So a skip needs a
quorum (:func:`fleet_round`): the round it goes to is one that at least
:func:`quorum` of the distinct peers heard (counted by agent id, whatever the number of
messages) have reached, at least two and more than half of them. One peer, honest or not,
can therefore never make an agent skip, nor set where it skips to: with one insider among
the peers heard, the round is one that at least one honest peer reached. With fewer than
two peers heard there is no skip (without a coordinator).
"""

from __future__ import annotations

from collections.abc import Mapping

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


#: The fewest distinct peers that must agree the fleet is ahead before an agent skips.
MIN_QUORUM = 2


def quorum(peers: int) -> int:
    """How many of ``peers`` distinct peers must have reached a round for an agent to skip to
    it: a majority, and never fewer than :data:`MIN_QUORUM`."""
    return max(MIN_QUORUM, peers // 2 + 1)


def fleet_round(peer_rounds: Mapping[str, int]) -> int | None:
    """The round a fleet is at, from the latest round each peer named (by agent id): the
    highest round that a :func:`quorum` of them have reached or passed (None: too few peers
    heard to say)."""
    needed = quorum(len(peer_rounds))
    if len(peer_rounds) < needed:
        return None
    return sorted(peer_rounds.values(), reverse=True)[needed - 1]


def rejoin_round(own: int, fleet: int, *, rounds: int, staleness: int) -> int | None:
    """The round an agent at ``own`` skips to when its fleet is at ``fleet`` (None: it stays):
    the fleet's, when that is more than :data:`REJOIN_GAP_ROUNDS` beyond the staleness bound
    ahead and not in the run's last :data:`REJOIN_GAP_ROUNDS` of ``rounds``."""
    if fleet > rounds - REJOIN_GAP_ROUNDS:
        return None
    if fleet - own > staleness + REJOIN_GAP_ROUNDS:
        return fleet
    return None
