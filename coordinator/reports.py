"""Round reports checked against the run before the coordinator keeps any of them.

A report is refused, whole, with a gRPC status that says why (:class:`~coordinator.refusal.
Refusal`) when one of its records

* names a round past the run's last (``OUT_OF_RANGE``): rounds run from 0 to the run's
  ``rounds`` (to :data:`~coordinator.run.MAX_ROUNDS` where the coordinator does not know it);
* carries an estimate whose length is not the run's (``FAILED_PRECONDITION``): every agent
  declares it when it registers (:func:`~coordinator.run.report_length` of its model), the
  first registration fixes it for the run, and a report without an estimate is always fine;
* goes back in time (``FAILED_PRECONDITION``): within one registration an agent's rounds only
  move forward. An agent that restarts registers again and may report from the round it
  resumed at (its latest report of a round is kept). A call retried because its reply was
  lost starts with the same round as the call before it: its records already held are taken
  as received again and not stored twice;
* or is out of order within its call (``INVALID_ARGUMENT``).

Each agent therefore holds at most one record per round of the run, whatever it sends: the
database is bounded by agents x (rounds + 1) records of bounded size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.refusal import Refusal
from edge.observability.stats import RoundRecord


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
    return fresh, ReportCursor(max(previous, cursor.last_round or 0), first)
