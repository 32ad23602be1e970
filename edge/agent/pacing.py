"""Bounded staleness: when an agent stops waiting for in-neighbours that fall behind."""

from __future__ import annotations

from collections.abc import Iterable

#: Rounds without hearing from an in-neighbour after which the agent stops waiting for it.
PATIENCE_ROUNDS = 4


def wait_over(heard: Iterable[int], need: int, patience: int = PATIENCE_ROUNDS) -> bool:
    """Whether an agent that needs its in-neighbours at round ``need`` or later, and last
    heard them at rounds ``heard``, stops waiting (at several gossip steps a round, the same
    with step positions for rounds and ``patience`` counted in steps).

    An in-neighbour between ``need - patience`` (:data:`PATIENCE_ROUNDS`) and ``need`` is
    waited for; one further behind is not (it is gone or restarting: waiting for it would
    cost every round the whole timeout), unless every in-neighbour is that far behind. Then
    the agent has nobody to pace it: were it to go on at once, it would run the rest of the
    run alone at the speed of its own computation, and never be within reach of its
    in-neighbours again (they can only fall further behind): in-process, with 80% loss on
    every link, agents ran off 700 rounds in half a second. It waits out the timeout
    instead, at most one round per timeout, until they are heard again. An agent without
    in-neighbours this round has nobody to wait for.
    """
    oldest = need - patience
    any_in_reach = False
    empty = True
    for round_heard in heard:
        empty = False
        if oldest <= round_heard < need:
            return False
        any_in_reach |= round_heard >= need
    return empty or any_in_reach


def step_heard(heard: Iterable[int], need: int, steps: int) -> bool:
    """Whether a further gossip step of a round (at ``steps`` a round) holds its
    in-neighbours' same step: none that last sent gossip step ``heard`` (a position, see
    :func:`~airgossip.edge.agent.mixing_steps.step_position`) is within a round's worth of
    steps short of step ``need``. On a one-peer graph an in-neighbour sends to the agent once
    a round, so one a round short keeps up; one further behind is not waited for here (the
    staleness of :func:`wait_over` paces the agent against it)."""
    return all(not need - steps <= position < need for position in heard)
