"""What the coordinator holds of its run: its spec, its start, its estimates' length, its
round records.

:class:`RunLedger` is the run's side of :class:`~airgossip.coordinator.membership.Membership`, used
under the membership's lock: it checks every report against the run
(:func:`~airgossip.coordinator.reports.admit`) before the round records go to the database
(:class:`~airgossip.coordinator.rounds.RoundStore`), and says how far the run is.
"""

from __future__ import annotations

from collections.abc import Sequence

from airgossip.coordinator.refusal import Refusal
from airgossip.coordinator.reports import ReportCursor, admit
from airgossip.coordinator.rounds import AgentRounds, RoundStore
from airgossip.coordinator.run import RunSpec
from airgossip.coordinator.store import FleetStore, StoredFleet
from airgossip.coordinator.views import ALIVE, FINISHED, RunStatus
from airgossip.edge.observability.stats import RoundRecord


class RunLedger:
    """The run of one fleet (not thread-safe: its owner's lock guards it).

    Parameters
    ----------
    run:
        The run as the coordinator was started with it; a database that holds a run keeps
        its id.
    store:
        The database the run is kept in.
    """

    def __init__(self, run: RunSpec, store: FleetStore) -> None:
        run_id = store.claim_run(run.run_id, dict(run.scenario))
        self.spec = RunSpec(run_id, run.scenario, run.rounds)
        self.store = store
        self.rounds = RoundStore(store.database)
        self.started_unix: float | None = None
        #: Elements of every estimate the run's reports carry (fixed by the first
        #: registration; None until then).
        self.estimate_length: int | None = None

    def restore(self, stored: StoredFleet) -> None:
        """Take back the start and estimate length of a stored run."""
        self.started_unix = stored.started_unix
        self.estimate_length = stored.estimate_length

    def start(self, now_unix: float) -> None:
        """The fleet is complete: the run starts now."""
        self.started_unix = now_unix
        self.store.mark_started(now_unix)

    def _length_in_force(self, held: bool) -> bool:
        """Whether the run's estimate length binds a newcomer: a live or finished member
        holds it (``held``) or round records of that length are kept."""
        return self.estimate_length is not None and (held or self.rounds.holds_any())

    def check_estimate_length(self, agent_id: str, length: int, *, held: bool = True) -> None:
        """Refuse an agent whose estimates would not be the run's length (``held``: a live
        or finished member holds the length; when none does and no round is kept, the
        length is free)."""
        if self._length_in_force(held) and length != self.estimate_length:
            raise Refusal(
                "FAILED_PRECONDITION",
                f"agent '{agent_id}' reports estimates of {length} elements; the run's have "
                f"{self.estimate_length} (a different model?)",
            )

    def fix_estimate_length(self, length: int, *, replace: bool = False) -> None:
        """The first registration fixes the length of the run's estimates; with ``replace``
        (no live or finished member holds it) a registration fixes it again, unless round
        records of the old length are kept."""
        if self.estimate_length == length:
            return
        if self.estimate_length is None or (replace and not self._length_in_force(False)):
            self.store.fix_estimate_length(length)
            self.estimate_length = length

    def keep(
        self, agent_id: str, records: Sequence[RoundRecord], cursor: ReportCursor
    ) -> tuple[AgentRounds, ReportCursor]:
        """Check one report call against the run and keep what is new; return what is held
        of the agent and its registration's cursor after the call (:class:`Refusal` for a
        call that does not fit the run)."""
        fresh, after = admit(
            agent_id, records, cursor,
            last_round=self.spec.last_round, estimate_length=self.estimate_length,
        )  # fmt: skip
        held = self.rounds.add(agent_id, fresh) if fresh else self.rounds.of(agent_id)
        return held, after

    def records(self) -> dict[str, list[RoundRecord]]:
        """Every agent's round records, in round order (read from the database)."""
        return self.rounds.records()

    def latest(self) -> dict[str, RoundRecord]:
        """Every agent's latest round record, without its estimate."""
        return self.rounds.latest()

    def at_round(self, round_index: int) -> dict[str, RoundRecord]:
        """Every agent's record of ``round_index``, by agent."""
        return self.rounds.at_round(round_index)

    def fleet_round(self) -> int:
        """The round the run's agents have reached, as a restarted agent skips to it: the
        highest round a quorum of them reported reaching (at least two and a majority, so
        that one agent's reports cannot set it; 0 before two have reported)."""
        return self.rounds.quorum_latest()

    def latest_round(self, agent_id: str) -> int | None:
        """The latest round ``agent_id`` reported (None: none)."""
        return self.rounds.of(agent_id).latest

    def status(self, states: Sequence[str], released: bool) -> RunStatus:
        """How far the run is, given every member's state: it is complete when nobody is
        alive and someone finished."""
        finished = states.count(FINISHED)
        return RunStatus(
            run_id=self.spec.run_id,
            rounds=self.spec.rounds,
            started_unix=self.started_unix,
            registered=states.count(ALIVE) + finished,
            finished=finished,
            complete=released and ALIVE not in states and finished > 0,
            fleet_round=self.fleet_round(),
        )
