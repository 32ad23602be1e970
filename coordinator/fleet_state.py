"""The fleet a coordinator holds, as it stands: its members, graphs and run (taken back from
the database when there is one), and the consistent views read from them. How the fleet
changes is :class:`~airgossip.coordinator.membership.Membership`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from airgossip.common.identity import natural_order
from airgossip.common.topology import Assignment
from airgossip.coordinator.assignments import AssignmentKeeper
from airgossip.coordinator.ledger import RunLedger
from airgossip.coordinator.member import LivenessSettings, Member
from airgossip.coordinator.policy import TopologyPolicy, TopologySpec
from airgossip.coordinator.roster import Roster
from airgossip.coordinator.run import RunSpec
from airgossip.coordinator.store import FleetStore, StoredFleet
from airgossip.coordinator.views import ALIVE, FINISHED, FleetView, RunStatus
from airgossip.edge.observability.stats import RoundRecord

log = logging.getLogger("airgossip.coordinator")


class FleetState:
    """The fleet's members, graphs and run, and what can be read of them; every read and
    every change holds :attr:`changed`.

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
        Most live registrations (each holds a stream and a server thread); departed ones
        count towards :data:`~airgossip.coordinator.member.MEMBERS_PER_SLOT` times as many.
    clock, wall:
        Monotonic seconds (liveness) and wall-clock seconds (timestamps kept in the store).
    run:
        The run this fleet is (a new id and no scenario when not given); a database that
        holds a run keeps its id.
    roster:
        The identities that may register (default: ``agent-0`` .. ``agent-(expected-1)``;
        :meth:`Roster.anyone` admits any); it must name at least ``expected``.
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
        roster: Roster | None = None,
    ) -> None:
        if expected < 1:
            raise ValueError(f"the coordinator needs to expect at least 1 agent, got {expected}")
        if max_agents < expected:
            raise ValueError(f"max_agents ({max_agents}) is below the expected {expected}")
        self.roster = roster if roster is not None else Roster.indexed(expected)
        self.roster.check_fits(expected)
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
        self.graphs = AssignmentKeeper(spec, policy, store)
        self.counters = {
            "registrations": 0, "heartbeats": 0, "failures": 0, "departures": 0, "finished": 0,
            "stalled_ms": 0,
        }  # fmt: skip
        self.ledger = RunLedger(run or RunSpec(), store)
        self.restored = self._restore(store.claim(policy.describe(), expected))

    def _restore(self, stored: StoredFleet | None) -> bool:
        if stored is None:
            return False
        # Liveness restarts from now: silence while the coordinator was down is not the
        # agents' fault, and each gets a full timeout to reach the new coordinator.
        now = self.clock()
        self.members = {i: Member(r, last_seen=now) for i, r in stored.members.items()}
        self.graphs.restore(stored)
        self.ledger.restore(stored)
        alive = sum(1 for m in self.members.values() if m.alive)
        log.info(
            "restored %d agents (%d alive) at epoch %d from %s",
            len(self.members), alive, self.epoch, self.store.path,
        )  # fmt: skip
        return True

    @property
    def released(self) -> bool:
        """Whether the first graph was built (the fleet filled)."""
        return self.graphs.graph is not None

    @property
    def run(self) -> RunSpec:
        """The run this fleet is."""
        return self.ledger.spec

    @property
    def estimate_length(self) -> int | None:
        """Elements of every estimate the run's reports carry (None: nobody registered)."""
        return self.ledger.estimate_length

    @property
    def epoch(self) -> int:
        """The current graph's epoch (0 before the first)."""
        return self.graphs.epoch

    @property
    def assignments(self) -> dict[str, Assignment]:
        """Every live agent's assignment at the current epoch."""
        return self.graphs.assignments

    def alive_ids(self) -> tuple[str, ...]:
        """The live agents, in natural order."""
        return natural_order(i for i, m in self.members.items() if m.alive)

    def registered(self) -> int:
        """Agents alive or finished (what a launcher waits for)."""
        with self.changed:
            return sum(1 for m in self.members.values() if m.record.state in (ALIVE, FINISHED))

    def status(self) -> RunStatus:
        """How far the run is: it is complete when nobody is alive and someone finished."""
        with self.changed:
            states = [m.record.state for m in self.members.values()]
            return self.ledger.status(states, self.released)

    def view(self) -> FleetView:
        """A consistent snapshot of the fleet."""
        with self.changed:
            now = self.clock()
            graph = self.graphs.graph
            members = tuple(m.view(now) for _, m in sorted(self.members.items()))
            return FleetView(
                topology=self.spec.name,
                expected=self.expected,
                released=self.released,
                epoch=self.epoch,
                members=members,
                edges=tuple(tuple(p) for p in graph.edges()) if graph else (),
                strongly_connected=graph.strongly_connected if graph else False,
                lambda2=self.graphs.lambda2,
                counters=dict(self.counters),
                restored=self.restored,
                run=self.status(),
                roster=self.roster.describe(),
            )

    def run_records(self) -> dict[str, list[RoundRecord]]:
        """Every agent's round records of the run, in round order (read from the database)."""
        return self.ledger.records()

    def latest_records(self) -> dict[str, RoundRecord]:
        """Every agent's latest round record of the run, without its estimate."""
        return self.ledger.latest()
