"""What the coordinator shows of its fleet: consistent snapshots and their JSON forms.

A :class:`FleetView` is taken under the membership's lock in one go, so metrics, service
discovery, ``/fleet`` and the CLI's progress lines never see a fleet half-way through a
change. The JSON forms are typed (:class:`FleetJson` and friends): they are what ``/fleet``
serves and what tools read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypedDict

from airgossip.edge.observability.telemetry import AgentSnapshot

#: Member states: heartbeating; silent past the timeout; said goodbye; ran its last round.
ALIVE, DEAD, LEFT, FINISHED = "alive", "dead", "left", "finished"


class RunStatusJson(TypedDict):
    """:class:`RunStatus` as ``/fleet`` serves it."""

    id: str
    rounds: int
    started_unix: float | None
    registered: int
    finished: int
    complete: bool
    fleet_round: int


class MemberJson(TypedDict):
    """One member as ``/fleet`` serves it."""

    agent_id: str
    state: str
    address: str
    metrics_address: str
    joined_at: float
    changed_at: float
    incarnation: int
    heartbeat_age_s: float | None
    assignment_epoch: int
    round: int | None
    accuracy: float | None


class FleetJson(TypedDict):
    """:class:`FleetView` as ``/fleet`` serves it."""

    topology: str
    expected: int
    released: bool
    restored: bool
    epoch: int
    strongly_connected: bool
    lambda2: float | None
    edges: list[list[list[str]]]
    counters: dict[str, int]
    run: RunStatusJson | None
    roster: str
    members: list[MemberJson]


class TargetGroup(TypedDict):
    """One Prometheus HTTP service discovery target group."""

    targets: list[str]
    labels: dict[str, str]


@dataclass(frozen=True)
class MemberView:
    """One member as the coordinator sees it at the moment of the view."""

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

    def to_json(self) -> MemberJson:
        """The member as ``/fleet`` serves it."""
        return {
            "agent_id": self.agent_id,
            "state": self.state,
            "address": self.address,
            "metrics_address": self.metrics_address,
            "joined_at": self.joined_at,
            "changed_at": self.changed_at,
            "incarnation": self.incarnation,
            "heartbeat_age_s": self.heartbeat_age_s,
            "assignment_epoch": self.assignment_epoch,
            "round": self.stats.round if self.stats else None,
            "accuracy": self.stats.accuracy if self.stats else None,
        }


@dataclass(frozen=True)
class RunStatus:
    """How far the run is."""

    run_id: str
    rounds: int
    started_unix: float | None
    registered: int
    finished: int
    complete: bool
    #: The round the run's agents have reached: the highest a quorum of them reported.
    fleet_round: int = 0

    def to_json(self) -> RunStatusJson:
        """The status as ``/fleet`` serves it."""
        return {
            "id": self.run_id,
            "rounds": self.rounds,
            "started_unix": self.started_unix,
            "registered": self.registered,
            "finished": self.finished,
            "complete": self.complete,
            "fleet_round": self.fleet_round,
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
    #: The identities the run admits, in words
    #: (:meth:`airgossip.coordinator.roster.Roster.describe`).
    roster: str = ""

    @property
    def alive(self) -> list[MemberView]:
        """The members heartbeating now."""
        return [m for m in self.members if m.state == ALIVE]

    def to_json(self) -> FleetJson:
        """The fleet as ``/fleet`` serves it."""
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
            "roster": self.roster,
            "members": [m.to_json() for m in self.members],
        }
