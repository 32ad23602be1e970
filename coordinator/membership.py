"""Fleet membership: registration, liveness by heartbeat, topology repair, persistence.

:class:`Fleet` is the coordinator's state machine, free of gRPC so that it can be driven
with a fake clock in tests. It waits until ``expected`` agents are alive, then *releases*
the fleet: the policy builds the first graph (epoch 1) and every agent gets its
:class:`~edge.topology.Assignment`. From then on every change (an agent that misses its
heartbeats for ``heartbeat_timeout_s``, leaves, rejoins under its id, moves to a new
address, or a newcomer the policy admits) produces a new graph and a new epoch, committed to
the :class:`~coordinator.store.FleetStore` before anyone hears of it.

The fleet is also one run (:class:`~coordinator.run.RunSpec`): it starts when the fleet is
released, collects every agent's round reports (:class:`~coordinator.run.RunLog`), and is
complete when no agent is alive any more and at least one has *finished* (reported its last
round). A finished agent is out of the liveness checks: its silence is the end of its run,
not a failure.

A policy with a graph schedule (:class:`~coordinator.policy.SwitchingPolicy`, a
``[switching]`` table) is driven by the reports: once every agent alive or finished has
reported past round ``r``, the schedule's switcher is told the fleet's figures of round ``r``
(:func:`~edge.topology.switching.fleet_figures`, as a fleet in one process measures them),
rounds in order; a switch is a new epoch on the next graph in which every agent keeps its
old peers (:func:`~edge.topology.switching.switched_assignments`), so what edges that left
the graph still owe is delivered and push-sum stays exact. Agents run on asynchronously:
each takes the new graph from wherever it is when the assignment reaches it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from coordinator.policy import FleetGraph, TopologyPolicy, TopologySpec
from coordinator.run import REASON_FINISHED, RunLog, RunSpec
from coordinator.store import FleetStore, MemberRecord, StoredFleet
from edge.config.identity import natural_order
from edge.observability.stats import RoundRecord
from edge.observability.telemetry import AgentSnapshot
from edge.topology import (
    Assignment,
    assignments_for_graph,
    fleet_figures,
    switched_assignments,
)

log = logging.getLogger("airgossip.coordinator")

ALIVE, DEAD, LEFT, FINISHED = "alive", "dead", "left", "finished"


class Refusal(Exception):
    """A request the coordinator turns down; ``code`` names the gRPC status."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class LivenessSettings:
    """How often agents report and how long the coordinator waits before declaring one dead.

    The timeout spans several intervals so that a loaded device, or a heartbeat lost on a
    wireless link, does not get an agent evicted.
    """

    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval_s <= 3600:
            raise ValueError(
                f"heartbeat interval must be within (0, 3600] s, got {self.heartbeat_interval_s}"
            )
        if self.heartbeat_timeout_s < 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"heartbeat timeout ({self.heartbeat_timeout_s} s) must be at least twice the "
                f"interval ({self.heartbeat_interval_s} s), or one late heartbeat evicts an agent"
            )


@dataclass
class Member:
    """A registration plus what is known only while this coordinator runs."""

    record: MemberRecord
    last_seen: float = 0.0
    stats: AgentSnapshot | None = None
    assignment_epoch: int = 0
    heartbeats: int = 0
    watch_generation: int = 0

    @property
    def alive(self) -> bool:
        return self.record.state == ALIVE


@dataclass(frozen=True)
class MemberView:
    agent_id: str
    state: str
    address: str
    metrics_address: str
    joined_at: float
    changed_at: float
    incarnation: int
    heartbeat_age_s: float | None
    assignment_epoch: int
    stats: AgentSnapshot | None


@dataclass(frozen=True)
class RunStatus:
    """How far the run is."""

    run_id: str
    rounds: int
    started_unix: float | None
    registered: int
    finished: int
    complete: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.run_id,
            "rounds": self.rounds,
            "started_unix": self.started_unix,
            "registered": self.registered,
            "finished": self.finished,
            "complete": self.complete,
        }


@dataclass(frozen=True)
class FleetView:
    """A consistent snapshot of the fleet for metrics, service discovery and inspection."""

    topology: str
    expected: int
    released: bool
    epoch: int
    members: tuple[MemberView, ...]
    edges: tuple[tuple[tuple[str, str], ...], ...] = ()
    strongly_connected: bool = False
    lambda2: float = math.nan
    counters: dict[str, int] = field(default_factory=dict)
    restored: bool = False
    run: RunStatus | None = None

    @property
    def alive(self) -> list[MemberView]:
        return [m for m in self.members if m.state == ALIVE]

    def to_json(self) -> dict[str, Any]:
        return {
            "topology": self.topology,
            "expected": self.expected,
            "released": self.released,
            "restored": self.restored,
            "epoch": self.epoch,
            "strongly_connected": self.strongly_connected,
            "lambda2": None if math.isnan(self.lambda2) else self.lambda2,
            "edges": [[list(e) for e in phase] for phase in self.edges],
            "counters": self.counters,
            "run": self.run.to_json() if self.run is not None else None,
            "members": [
                {
                    "agent_id": m.agent_id,
                    "state": m.state,
                    "address": m.address,
                    "metrics_address": m.metrics_address,
                    "joined_at": m.joined_at,
                    "changed_at": m.changed_at,
                    "incarnation": m.incarnation,
                    "heartbeat_age_s": m.heartbeat_age_s,
                    "assignment_epoch": m.assignment_epoch,
                    "round": m.stats.round if m.stats else None,
                    "accuracy": m.stats.accuracy if m.stats else None,
                }
                for m in self.members
            ],
        }


class Fleet:
    """Registrations, liveness and assignments; every method is thread-safe.

    Parameters
    ----------
    expected:
        Agents to wait for before the first graph is built.
    spec, policy:
        The topology and the policy that maintains it.
    store:
        Persistence; a stored fleet is taken back (after checking it runs the same topology).
    liveness:
        Heartbeat interval and timeout.
    max_agents:
        Upper bound on registrations (each holds a stream and a server thread).
    clock, wall:
        Monotonic seconds (liveness) and wall-clock seconds (timestamps kept in the store).
    run:
        The run this fleet is (a new id and no scenario when not given); a database that
        holds a run keeps its id.
    """

    def __init__(
        self,
        *,
        expected: int,
        spec: TopologySpec,
        policy: TopologyPolicy,
        store: FleetStore,
        liveness: LivenessSettings | None = None,
        max_agents: int = 1024,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        run: RunSpec | None = None,
    ) -> None:
        if expected < 1:
            raise ValueError(f"the coordinator needs to expect at least 1 agent, got {expected}")
        if max_agents < expected:
            raise ValueError(f"max_agents ({max_agents}) is below the expected {expected}")
        self.expected = expected
        self.spec = spec
        self.policy = policy
        self.store = store
        self.liveness = liveness or LivenessSettings()
        self.max_agents = max_agents
        self.clock = clock
        self.wall = wall
        self.changed = threading.Condition()
        self.members: dict[str, Member] = {}
        self.assignments: dict[str, Assignment] = {}
        self.graph: FleetGraph | None = None
        self.epoch = 0
        self.counters = {
            "registrations": 0, "heartbeats": 0, "failures": 0, "departures": 0, "finished": 0,
        }  # fmt: skip
        run = run or RunSpec()
        run_id = store.claim_run(run.run_id, dict(run.scenario))
        self.run = RunSpec(run_id, run.scenario, run.rounds)
        self.log = RunLog()
        self.started_unix: float | None = None
        #: The next round whose figures the policy's switcher is told.
        self.next_observed = 1
        self.restored = self._restore(store.claim(policy.describe(), expected))

    def _restore(self, stored: StoredFleet | None) -> bool:
        if stored is None:
            return False
        now = self.clock()
        # Liveness restarts from now: silence while the coordinator was down is not the
        # agents' fault, and each gets a full timeout to reach the new coordinator.
        self.members = {i: Member(r, last_seen=now) for i, r in stored.members.items()}
        self.assignments = dict(stored.assignments)
        self.epoch = stored.epoch
        self.graph = FleetGraph.from_json(stored.graph) if stored.graph else None
        self.policy.restore(stored.policy_state)
        switcher = self.policy.switcher
        if switcher is not None and switcher.switched_at:
            # The rounds since the last switch are told again from the stored reports: the
            # switcher's streak and loss window come back exactly as they were.
            self.next_observed = switcher.switched_at[-1]
        self.started_unix = stored.started_unix
        for agent_id, records in self.store.load_rounds().items():
            self.log.add(agent_id, records)
        alive = sum(1 for m in self.members.values() if m.alive)
        log.info(
            "restored %d agents (%d alive) at epoch %d from %s",
            len(self.members), alive, self.epoch, self.store.path,
        )  # fmt: skip
        return True

    def grant_grace(self) -> None:
        """Give every live agent a full timeout from now (a coordinator that starts serving
        again after a restart must not count its own absence against them)."""
        with self.changed:
            now = self.clock()
            for member in self.members.values():
                member.last_seen = max(member.last_seen, now)

    # -- queries ------------------------------------------------------------------------------
    @property
    def released(self) -> bool:
        return self.graph is not None

    def alive_ids(self) -> tuple[str, ...]:
        return natural_order(i for i, m in self.members.items() if m.alive)

    def registered(self) -> int:
        """Agents alive or finished (what a launcher waits for)."""
        with self.changed:
            return sum(1 for m in self.members.values() if m.record.state in (ALIVE, FINISHED))

    def status(self) -> RunStatus:
        """How far the run is: it is complete when nobody is alive and someone finished."""
        with self.changed:
            states = [m.record.state for m in self.members.values()]
            finished = states.count(FINISHED)
            return RunStatus(
                run_id=self.run.run_id,
                rounds=self.run.rounds,
                started_unix=self.started_unix,
                registered=states.count(ALIVE) + finished,
                finished=finished,
                complete=self.released and ALIVE not in states and finished > 0,
            )

    def view(self) -> FleetView:
        with self.changed:
            now = self.clock()
            graph = self.graph
            first = next(iter(self.assignments.values()), None)
            lambda2 = first.lambda2 if first is not None else math.nan
            members = tuple(
                MemberView(
                    agent_id=i,
                    state=m.record.state,
                    address=m.record.address,
                    metrics_address=m.record.metrics_address,
                    joined_at=m.record.joined_at,
                    changed_at=m.record.changed_at,
                    incarnation=m.record.incarnation,
                    heartbeat_age_s=round(now - m.last_seen, 3) if m.alive else None,
                    assignment_epoch=m.assignment_epoch,
                    stats=m.stats,
                )
                for i, m in sorted(self.members.items())
            )
            return FleetView(
                topology=self.spec.name,
                expected=self.expected,
                released=self.released,
                epoch=self.epoch,
                members=members,
                edges=tuple(tuple(p) for p in graph.edges()) if graph else (),
                strongly_connected=graph.strongly_connected if graph else False,
                lambda2=lambda2,
                counters=dict(self.counters),
                restored=self.restored,
                run=self.status(),
            )

    # -- changes ------------------------------------------------------------------------------
    def register(self, agent_id: str, address: str, digest: str, metrics_address: str = "") -> int:
        """Register or re-register ``agent_id``; return the epoch. Raises :class:`Refusal`."""
        with self.changed:
            digests = {m.record.digest for i, m in self.members.items() if i != agent_id}
            if digests and digest not in digests:
                raise Refusal(
                    "FAILED_PRECONDITION",
                    f"agent '{agent_id}' runs a different task or initial parameters than the "
                    f"fleet (digest {digest!r})",
                )
            member = self.members.get(agent_id)
            alive = len(self.alive_ids())
            if member is None or not member.alive:
                if self.released and not self.policy.admits(agent_id):
                    raise Refusal(
                        "RESOURCE_EXHAUSTED",
                        f"the fleet is full: topology '{self.spec.name}' takes no agents beyond "
                        f"those it was built over, and '{agent_id}' is not one of them",
                    )
                if (not self.released and alive >= self.expected) or alive >= self.max_agents:
                    raise Refusal(
                        "RESOURCE_EXHAUSTED",
                        f"the fleet is full ({max(alive, self.expected)} agents)",
                    )
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
            if not self.released:
                if len(self.alive_ids()) >= self.expected:
                    self._rebuild("fleet complete")
                    self.started_unix = self.wall()
                    self.store.mark_started(self.started_unix)
                else:
                    self.store.commit([record])
            elif changed:
                self._rebuild(f"{agent_id} (re)joined")
            else:
                self.store.commit([record])
            self.changed.notify_all()
            return self.epoch

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
        """Keep ``agent_id``'s round records for the run's results; return how many rounds
        it has reported. A final record finishes the agent. NOT_FOUND for an agent that never
        registered."""
        with self.changed:
            member = self.members.get(agent_id)
            if member is None:
                raise Refusal("NOT_FOUND", f"agent '{agent_id}' is not registered; register")
            if member.alive:
                member.last_seen = self.clock()  # a report is a sign of life too
            held = self.log.add(agent_id, records)
            self.store.add_rounds(agent_id, records)
            if member.alive and any(r.final for r in records):
                self._finish(member)
            self._follow_schedule()
            return held

    def _follow_schedule(self) -> None:
        """Tell the policy's switcher every round the fleet has passed since the last one
        told, in order; switch graphs when it says so."""
        switcher = self.policy.switcher
        if switcher is None or not self.released:
            return
        counted = [i for i, m in self.members.items() if m.record.state in (ALIVE, FINISHED)]
        latest = [self.log.latest_round(i) for i in counted]
        passed = min((r if r is not None else -1 for r in latest), default=-1)
        while self.next_observed <= passed and not switcher.finished:
            round_index = self.next_observed
            self.next_observed += 1
            reported = self.log.at_round(round_index)
            records = [reported[i] for i in counted if i in reported]
            graph = switcher.observe(fleet_figures(round_index, records, len(counted)))
            if graph is not None:
                self._rebuild(
                    f"[switching]: {graph.name} from round {round_index + 1}", keep_peers=True
                )
                self.changed.notify_all()

    def _finish(self, member: Member) -> None:
        member.record.state, member.record.changed_at = FINISHED, self.wall()
        self.counters["finished"] += 1
        self.store.commit([member.record])
        log.info(
            "%s finished (round %s reported)",
            member.record.agent_id, self.log.latest_round(member.record.agent_id),
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
        from coordinator.policy import EdgeListPolicy

        with self.changed:
            if not isinstance(self.policy, EdgeListPolicy):
                raise Refusal(
                    "FAILED_PRECONDITION",
                    f"edge lists need topology 'edges', this fleet runs '{self.spec.name}'",
                )
            self.policy.set_edges(list(pairs))
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
        self, why: str, *, keep_peers: bool = False, extra: Iterable[MemberRecord] = ()
    ) -> None:
        """A new epoch on the policy's next graph (``keep_peers``: every agent's directory
        keeps its old peers, for a switch of graphs)."""
        alive = self.alive_ids()
        epoch = self.epoch + 1
        graph = self.policy.graph(alive, self.graph, epoch)
        addresses = {i: self.members[i].record.address for i in graph.ids}
        scheme = self.spec.scheme
        if keep_peers:
            assignments = switched_assignments(
                self.assignments, graph.graph, addresses, epoch=epoch, scheme=scheme
            )
        else:
            assignments = assignments_for_graph(graph.graph, addresses, epoch=epoch, scheme=scheme)
        records = {m.record.agent_id: m.record for m in self.members.values() if m.alive}
        records.update({r.agent_id: r for r in extra})
        self.store.commit(
            records.values(),
            epoch=epoch,
            graph=graph.to_json(),
            policy_state=self.policy.state(),
            assignments=assignments,
        )
        self.epoch, self.graph, self.assignments = epoch, graph, assignments
        log.info(
            "epoch %d (%s): %d agents, %s, strongly connected: %s, |lambda2| %.4f",
            epoch, why, len(alive), graph.graph.name, graph.strongly_connected,
            next(iter(assignments.values())).lambda2,
        )  # fmt: skip
