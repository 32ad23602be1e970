"""Round reports checked against the run before the coordinator keeps any of them.

A report is refused, whole, with a gRPC status that says why
(:class:`~airgossip.coordinator.refusal.Refusal`) when one of its records

* names a round past the run's last (``OUT_OF_RANGE``): rounds run from 0 to the run's
  ``rounds`` (to :data:`~airgossip.coordinator.run.MAX_ROUNDS` where the coordinator does not know
  it);
* carries an estimate whose length is not the run's (``FAILED_PRECONDITION``): every agent
  declares it when it registers (:func:`~airgossip.coordinator.run.report_length` of its model), the
  first registration fixes it for the run, and a report without an estimate is always fine;
* goes back in time (``FAILED_PRECONDITION``): within one registration an agent's rounds only
  move forward. An agent that restarts registers again and may report from the round it
  resumed at (its latest report of a round is kept). A call retried because its reply was
  lost starts with the same round as the call before it: its records already held are taken
  as received again and not stored twice;
* is out of order within its call (``INVALID_ARGUMENT``);
* or says something that cannot be true (``INVALID_ARGUMENT``, :func:`check_meaning`): an
  accuracy outside [0, 1], a loss, distance, weight or privacy figure that is negative, a
  figure, time or estimate value that is not finite, or counters that go back. An agent's
  counters (:class:`~airgossip.edge.observability.stats.Counters`) add up what it sent and received
  since it started, so within one registration they never decrease, from record to record
  of a call and from one call to the next (the cursor keeps the last). A restarted agent
  registers again and starts them afresh (from its checkpoint's, or from 0).

Each agent therefore holds at most one record per round of the run, whatever it sends: the
database is bounded by agents x (rounds + 1) records of bounded size.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from airgossip.coordinator.refusal import Refusal
from airgossip.edge.observability.stats import Counters, RoundRecord
from airgossip.edge.privacy.figures import EPSILON, EPSILON_MEAN, EXHAUSTED, STEPS

#: Figures that are fractions, in [0, 1]: ``accuracy`` and ``<anything>_accuracy``.
FRACTION = re.compile(r"(.+_)?accuracy")
#: Figures that cannot be negative: losses, distances, push-sum weights (``weight`` and a
#: shared copy's ``y1``, ``y2``, ...), the learning rate and the privacy figures.
NON_NEGATIVE = re.compile(
    r"(.+_)?loss|(.+_)?distance|disagreement|weight|y[0-9]+|lr|"
    + "|".join(re.escape(name) for name in (EPSILON, EPSILON_MEAN, STEPS, EXHAUSTED))
)


@dataclass(frozen=True)
class ReportCursor:
    """Where one registration of an agent stands in its reports.

    Attributes
    ----------
    last_round:
        The latest round this registration reported (None: none yet).
    first_of_last_call:
        The first round of its latest report call (a retry starts there again).
    """

    last_round: int | None = None
    first_of_last_call: int | None = None
    #: The counters of its latest record (they only grow within a registration).
    counters: Counters | None = None


def wrong_length(round_index: int, elements: int, estimate_length: int | None) -> Refusal:
    """The refusal of an estimate of ``elements`` values in a run of ``estimate_length``."""
    expected = (
        f"the run's estimates have {estimate_length} elements"
        if estimate_length
        else "the run's reports carry none (its agents registered without one)"
    )
    return Refusal(
        "FAILED_PRECONDITION",
        f"round {round_index}: an estimate of {elements} elements; {expected}",
    )


def check_meaning(record: RoundRecord) -> None:
    """Refuse (``INVALID_ARGUMENT``) a record that says something that cannot be true: an
    accuracy outside [0, 1], a negative loss, distance, weight or privacy figure, a figure or
    time that is not finite, an estimate with a value that is not finite, a negative counter.

    Figures of other names (a user's task may report anything) need only be finite.
    """
    where = f"round {record.round}"
    if not (math.isfinite(record.wall_s) and record.wall_s >= 0):
        raise Refusal(
            "INVALID_ARGUMENT",
            f"{where}: wall_s is {record.wall_s!r}; it must be a finite number of seconds, "
            "at least 0",
        )
    for kind, figures in (("metric", record.metrics), ("scalar", record.scalars)):
        for name, value in figures.items():
            _check_figure(where, kind, name, value)
    if record.estimate is not None and not np.isfinite(record.estimate).all():
        raise Refusal("INVALID_ARGUMENT", f"{where}: the estimate holds NaN or infinity")
    negative = [name for name, value in record.counters.as_dict().items() if value < 0]
    if negative:
        raise Refusal("INVALID_ARGUMENT", f"{where}: counter {negative[0]} is negative")


def _check_figure(where: str, kind: str, name: str, value: float) -> None:
    shown = f"{where}: {kind} '{name[:64]}' is {value!r}"
    if not math.isfinite(value):
        raise Refusal("INVALID_ARGUMENT", f"{shown}; figures must be finite numbers")
    if FRACTION.fullmatch(name) and not 0.0 <= value <= 1.0:
        raise Refusal("INVALID_ARGUMENT", f"{shown}; an accuracy is a fraction in [0, 1]")
    if NON_NEGATIVE.fullmatch(name) and value < 0:
        raise Refusal("INVALID_ARGUMENT", f"{shown}; it cannot be negative")


def check_counters_grow(
    agent_id: str, round_index: int, counters: Counters, before: Counters | None
) -> None:
    """Refuse (``INVALID_ARGUMENT``) counters of ``round_index`` below ``before`` (those of
    the agent's previous record in this registration): they add up since the agent started."""
    if before is None:
        return
    now, then = counters.as_dict(), before.as_dict()
    for name, value in now.items():
        if value < then[name]:
            raise Refusal(
                "INVALID_ARGUMENT",
                f"round {round_index}: {agent_id}'s {name} went back from {then[name]} to "
                f"{value}; counters add up since the agent started and never decrease (an "
                "agent that restarted registers again)",
            )


def admit(
    agent_id: str,
    records: Sequence[RoundRecord],
    cursor: ReportCursor,
    *,
    last_round: int,
    estimate_length: int | None,
) -> tuple[list[RoundRecord], ReportCursor]:
    """The records of one report call to keep, and the registration's cursor after them.

    Parameters
    ----------
    agent_id:
        Who reports (named in the refusals).
    records:
        The call's records, in the order sent.
    cursor:
        Where the agent's registration stands.
    last_round:
        The run's last round.
    estimate_length:
        Elements of every estimate of the run (None: no estimate is expected).

    Raises
    ------
    Refusal
        For the whole call, as the module says.
    """
    if not records:
        return [], cursor
    previous = -1
    counters: Counters | None = None
    for record in records:
        if record.round <= previous:
            raise Refusal(
                "INVALID_ARGUMENT",
                f"round {record.round} follows round {previous} in one report: a report's "
                "rounds must increase",
            )
        previous = record.round
        if record.round > last_round:
            raise Refusal(
                "OUT_OF_RANGE",
                f"round {record.round} is past the run's last round {last_round}",
            )
        if record.estimate is not None and record.estimate.size != estimate_length:
            raise wrong_length(record.round, record.estimate.size, estimate_length)
        check_meaning(record)
        check_counters_grow(agent_id, record.round, record.counters, counters)
        counters = record.counters
    first = records[0].round
    fresh = list(records)
    if cursor.last_round is not None and first <= cursor.last_round:
        if first != cursor.first_of_last_call:
            raise Refusal(
                "FAILED_PRECONDITION",
                f"round {first} comes after round {cursor.last_round} of {agent_id}'s "
                "reports: rounds only move forward (an agent that restarted registers again)",
            )
        fresh = [r for r in records if r.round > cursor.last_round]
    if fresh:
        check_counters_grow(agent_id, fresh[0].round, fresh[0].counters, cursor.counters)
    last_counters = fresh[-1].counters.copy() if fresh else cursor.counters
    return fresh, ReportCursor(max(previous, cursor.last_round or 0), first, last_counters)
