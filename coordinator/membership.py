"""Fleet membership: registration, liveness by heartbeat, topology repair, the run's reports.

:class:`Membership` is the coordinator's state machine, free of gRPC so that it can be driven
with a fake clock in tests. It waits until ``expected`` agents are alive, then *releases* the fleet:
the policy builds the first graph (epoch 1) and every agent gets its
:class:`~airgossip.common.topology.Assignment`
(:class:`~airgossip.coordinator.assignments.AssignmentKeeper`). From then on every change (an agent
that misses its heartbeats for ``heartbeat_timeout_s``, leaves, rejoins under its id, moves to a new
address, or a newcomer the policy admits) produces a new graph and a new epoch, committed to the
database before anyone hears of it.

Only the run's members register (its :class:`~airgossip.coordinator.roster.Roster`, by default the
ids ``agent-0`` .. ``agent-(expected-1)``): anyone else is refused before anything is
recorded. The run's task digest and estimate length are fixed by its members: by the live or
finished ones, so that a member that registered with another task and then died or left
releases them (a dead registrant holds nothing; the estimate length stays fixed once round
records are kept, which are of that length).

The fleet is also one run (:class:`~airgossip.coordinator.run.RunSpec`): it starts when the fleet is
released, keeps every agent's round reports (checked against the run by
:func:`~airgossip.coordinator.reports.admit`, kept in the database by
:class:`~airgossip.coordinator.rounds.RoundStore`; they drive a ``[switching]`` schedule), and is
complete when no agent is alive any more and at least one has *finished* (reported its last
round). A finished agent is out of the liveness checks: its silence is the end of its run,
not a failure.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from airgossip.common.identity import natural_order
from airgossip.common.topology import Assignment
from airgossip.coordinator.fleet_state import FleetState
from airgossip.coordinator.member import MEMBERS_PER_SLOT, LivenessSettings, Member, WatchEnded
from airgossip.coordinator.refusal import Refusal
from airgossip.coordinator.reports import ReportCursor
from airgossip.coordinator.run import REASON_FINISHED
from airgossip.coordinator.store import MemberRecord
from airgossip.coordinator.views import ALIVE, DEAD, FINISHED, LEFT, FleetView
from airgossip.edge.observability.stats import RoundRecord
from airgossip.edge.observability.telemetry import AgentSnapshot

__all__ = ["FleetView", "LivenessSettings", "Membership", "Refusal", "WatchEnded"]

log = logging.getLogger("airgossip.coordinator")
#: A stall of the coordinator this long or longer is logged (shorter ones are only counted).
STALL_NOTICE_S = 1.0


class Membership(FleetState):
    """Registrations, liveness, assignments and the run's reports; thread-safe. Its
    parameters are :class:`~airgossip.coordinator.fleet_state.FleetState`'s.
    """

    def grant_grace(self) -> None:
        """Give every live agent a full timeout from now (a coordinator that starts serving
        again after a restart must not count its own absence against them)."""
        with self.changed:
            now = self.clock()
            for member in self.members.values():
                member.last_seen = max(member.last_seen, now)

    def credit_stall(self, seconds: float) -> None:
        """The coordinator itself did not run for ``seconds`` (its liveness sweep woke that
        late: a starved process, or a thread that held the interpreter): heartbeats sent
        meanwhile wait in its queues, so no live agent's silence over that time counts. On a
        host this loaded every declaration comes that much later, not one too early."""
        if seconds <= 0:
            return
        with self.changed:
            now = self.clock()
            for member in self.members.values():
                if member.alive:
                    member.last_seen = min(now, member.last_seen + seconds)
            self.counters["stalled_ms"] += round(seconds * 1000)
        if seconds >= STALL_NOTICE_S:
            log.warning(
                "the coordinator did not run for %.1f s (its liveness sweep woke that late): "
                "the agents' silence over that time is not counted",
                seconds,
            )

    def register(
        self,
        agent_id: str,
        address: str,
        digest: str,
        metrics_address: str = "",
        *,
        estimate_length: int = 0,
    ) -> int:
        """Register or re-register ``agent_id``; return the epoch. Raises :class:`Refusal`.

        ``estimate_length``: elements of the estimates its reports carry (0: none); the first
        registration fixes the run's, and an agent that declares another is refused. Every
        registration starts its reports afresh
        (:class:`~airgossip.coordinator.reports.ReportCursor`). An identity outside the roster is
        refused (``PERMISSION_DENIED``) with nothing recorded or counted.
        """
        self.roster.check(agent_id)
        with self.changed:
            member = self.members.get(agent_id)
            self._check_joining(agent_id, member, digest, estimate_length)
            now = self.wall()
            self.counters["registrations"] += 1
            if member is None:
                record = MemberRecord(agent_id, address, metrics_address, digest, ALIVE, now, now)
                member = self.members[agent_id] = Member(record)
                changed = True
                log.info("%s joined from %s", agent_id, address)
            else:
                record = member.record
                changed = not member.alive or record.address != address
                if changed:
                    record.incarnation += 1
                    record.changed_at = now
                    log.info("%s rejoined from %s (was %s)", agent_id, address, record.state)
                record.state, record.address, record.digest = ALIVE, address, digest
                record.metrics_address = metrics_address
            member.last_seen = self.clock()
            member.stats = None if changed else member.stats
            member.cursor = ReportCursor()
            self.ledger.fix_estimate_length(estimate_length, replace=not self._holders(agent_id))
            if not self.released:
                if len(self.alive_ids()) >= self.expected:
                    self._rebuild("fleet complete")
                    self.ledger.start(self.wall())
                else:
                    self.store.commit([record])
            elif changed:
                self._rebuild(f"{agent_id} (re)joined")
            else:
                self.store.commit([record])
            self.changed.notify_all()
            return self.epoch

    def _holders(self, agent_id: str) -> list[Member]:
        """The members other than ``agent_id`` that hold the run's task digest and estimate
        length: the live and finished ones (a member that died or left holds nothing, so a
        registration that was never followed by the run cannot keep the real agents out)."""
        return [
            m for i, m in self.members.items()
            if i != agent_id and m.record.state in (ALIVE, FINISHED)
        ]  # fmt: skip

    def _check_joining(
        self, agent_id: str, member: Member | None, digest: str, estimate_length: int
    ) -> None:
        holders = self._holders(agent_id)
        digests = {m.record.digest for m in holders}
        if digests and digest not in digests:
            held = ", ".join(natural_order(m.record.agent_id for m in holders)[:4])
            raise Refusal(
                "FAILED_PRECONDITION",
                f"agent '{agent_id}' runs a different task or initial parameters than the "
                f"fleet (digest {digest!r}; the fleet's is {sorted(digests)[0]!r}, held by "
                f"{held}{', ...' if len(holders) > 4 else ''})",
            )
        self.ledger.check_estimate_length(agent_id, estimate_length, held=bool(holders))
        if member is not None and member.alive:
            return
        alive = len(self.alive_ids())
        if self.released and not self.policy.admits(agent_id):
            raise Refusal(
                "RESOURCE_EXHAUSTED",
                f"the fleet is full: topology '{self.spec.name}' takes no agents beyond "
                f"those it was built over, and '{agent_id}' is not one of them",
            )
        if (not self.released and alive >= self.expected) or alive >= self.max_agents:
            raise Refusal(
                "RESOURCE_EXHAUSTED", f"the fleet is full ({max(alive, self.expected)} agents)"
            )
        if member is None and len(self.members) >= MEMBERS_PER_SLOT * self.max_agents:
            raise Refusal(
                "RESOURCE_EXHAUSTED",
                f"the run has seen {len(self.members)} agents, the most it keeps; agents that "
                "were part of it may register again",
            )

    def heartbeat(self, agent_id: str, stats: AgentSnapshot | None, assignment_epoch: int) -> int:
        """Note that ``agent_id`` is alive; return the epoch. NOT_FOUND when it must register."""
        with self.changed:
            member = self.members.get(agent_id)
            if member is None:
                raise Refusal("NOT_FOUND", f"agent '{agent_id}' is not registered; register")
            if member.record.state == FINISHED:
                return self.epoch  # a late heartbeat of a finished agent: nothing to watch
            if not member.alive:
                raise Refusal(
                    "NOT_FOUND",
                    f"agent '{agent_id}' was declared {member.record.state}; register again",
                )
            member.last_seen = self.clock()
            member.heartbeats += 1
            member.assignment_epoch = assignment_epoch
            if stats is not None:
                known = set(self.members)
                links = {p: t for p, t in stats.links.items() if p in known}
                member.stats = AgentSnapshot(**{**vars(stats), "links": links})
            self.counters["heartbeats"] += 1
            return self.epoch

    def leave(self, agent_id: str, reason: str = "") -> None:
        """``agent_id`` leaves for good (until it registers again); with reason
        ``finished`` it ran its last round: it is finished, and the graph stays as it is
        (its neighbours' last messages may still be on their way to it)."""
        with self.changed:
            member = self.members.get(agent_id)
            if member is None or not member.alive:
                return
            if reason == REASON_FINISHED:
                self._finish(member)
                return
            member.record.state, member.record.changed_at = LEFT, self.wall()
            self.counters["departures"] += 1
            log.info("%s left%s", agent_id, f" ({reason})" if reason else "")
            self._after_departure([member.record], f"{agent_id} left")

    def report(self, agent_id: str, records: list[RoundRecord]) -> int:
        """Keep ``agent_id``'s round records, checked against the run (:class:`RunLedger`);
        return how many rounds it holds. A final record finishes the agent."""
        with self.changed:
            member = self.members.get(agent_id)
            if member is None:
                raise Refusal("NOT_FOUND", f"agent '{agent_id}' is not registered; register")
            held, member.cursor = self.ledger.keep(agent_id, records, member.cursor)
            if member.alive:
                member.last_seen = self.clock()  # a report is a sign of life too
            if member.alive and any(r.final for r in records):
                self._finish(member)
            self._follow_schedule()
            return held.held

    def open_watch(self, agent_id: str) -> int:
        """Start a watch of ``agent_id``'s assignments; return its generation. A newer watch
        of the same agent (it reconnected) ends the older, so that half-open connections never
        pile up server threads. NOT_FOUND for an agent that is not registered."""
        with self.changed:
            member = self.members.get(agent_id)
            if member is None:
                raise Refusal("NOT_FOUND", f"agent '{agent_id}' is not registered")
            member.watch_generation += 1
            self.changed.notify_all()
            return member.watch_generation

    def next_assignment(
        self, agent_id: str, generation: int, sent_epoch: int, timeout_s: float
    ) -> tuple[int, Assignment] | None:
        """The epoch and ``agent_id``'s assignment once the epoch is past ``sent_epoch``,
        waiting at most ``timeout_s`` (None: nothing new yet).

        Raises
        ------
        WatchEnded
            A newer watch of the agent took over ``generation``.
        Refusal
            NOT_FOUND: the agent was declared dead or left; it must register again.
        """
        with self.changed:
            for waited in (False, True):
                member = self.members[agent_id]
                if member.watch_generation != generation:
                    raise WatchEnded(agent_id)
                if not member.alive and member.record.state != FINISHED:
                    raise Refusal(
                        "NOT_FOUND",
                        f"agent '{agent_id}' was declared {member.record.state}; register again",
                    )
                assignment = self.assignments.get(agent_id)
                if self.epoch != sent_epoch and assignment is not None:
                    return self.epoch, assignment
                if not waited:
                    self.changed.wait(timeout=timeout_s)
            return None

    def wake(self) -> None:
        """Wake every waiting watch (to see its stream closed, say)."""
        with self.changed:
            self.changed.notify_all()

    def _follow_schedule(self) -> None:
        """Tell the policy's switcher every round the fleet has passed since the last one
        told, in order; switch graphs when it says so."""
        counted = [i for i, m in self.members.items() if m.record.state in (ALIVE, FINISHED)]
        latest = [self.ledger.latest_round(i) for i in counted]
        passed = min((r if r is not None else -1 for r in latest), default=-1)
        for round_index in self.graphs.rounds_to_observe(passed):
            reported = self.ledger.at_round(round_index)
            records = [reported[i] for i in counted if i in reported]
            switched = self.graphs.observe(round_index, records, len(counted))
            if switched:
                self._rebuild(f"[switching]: {switched} from round {round_index + 1}", True)
                self.changed.notify_all()

    def _finish(self, member: Member) -> None:
        member.record.state, member.record.changed_at = FINISHED, self.wall()
        self.counters["finished"] += 1
        self.store.commit([member.record])
        log.info(
            "%s finished (round %s reported)",
            member.record.agent_id, self.ledger.latest_round(member.record.agent_id),
        )  # fmt: skip
        self.changed.notify_all()

    def expire(self) -> list[str]:
        """Declare dead every agent silent for longer than the timeout; repair the graph."""
        with self.changed:
            now = self.clock()
            timeout = self.liveness.heartbeat_timeout_s
            dead = [m for m in self.members.values() if m.alive and now - m.last_seen > timeout]
            if not dead:
                return []
            wall = self.wall()
            for member in dead:
                member.record.state, member.record.changed_at = DEAD, wall
                member.stats = None
                log.warning(
                    "%s silent for %.1f s (timeout %.1f s): declared dead",
                    member.record.agent_id, now - member.last_seen, timeout,
                )  # fmt: skip
            self.counters["failures"] += len(dead)
            ids = ", ".join(m.record.agent_id for m in dead)
            self._after_departure([m.record for m in dead], f"{ids} declared dead")
            return [m.record.agent_id for m in dead]

    def next_expiry(self) -> float | None:
        """Monotonic time at which the next agent will be overdue (None: nobody alive)."""
        with self.changed:
            seen = [m.last_seen for m in self.members.values() if m.alive]
            return min(seen) + self.liveness.heartbeat_timeout_s if seen else None

    def set_edges(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Replace the graph by an explicit edge list (``edges`` topology); return the epoch."""
        with self.changed:
            self.graphs.set_edges(pairs)
            self._rebuild("new edge list")
            self.changed.notify_all()
            return self.epoch

    def _after_departure(self, records: list[MemberRecord], why: str) -> None:
        if self.released and self.alive_ids():
            self._rebuild(why, extra=records)
        else:
            self.store.commit(records)
        self.changed.notify_all()

    def _rebuild(
        self, why: str, keep_peers: bool = False, extra: Iterable[MemberRecord] = ()
    ) -> None:
        """A new epoch over the live agents, committed with their records and ``extra``."""
        records = {m.record.agent_id: m.record for m in self.members.values() if m.alive}
        records.update({r.agent_id: r for r in extra})
        addresses = {i: m.record.address for i, m in self.members.items()}
        self.graphs.rebuild(
            why, self.alive_ids(), addresses, records.values(), keep_peers=keep_peers
        )
