"""One agent's registration as the coordinator holds it, and how liveness is judged."""

from __future__ import annotations

from dataclasses import dataclass, field

from airgossip.coordinator.reports import ReportCursor
from airgossip.coordinator.store import MemberRecord
from airgossip.coordinator.views import ALIVE, MemberView
from airgossip.edge.observability.telemetry import AgentSnapshot

#: Members remembered per agent the coordinator serves at once: departed ones stay (their
#: reports are the run's) up to this many times ``max_agents``, then newcomers are refused.
MEMBERS_PER_SLOT = 4


class WatchEnded(Exception):
    """A newer watch of the same agent took over this one."""


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
    #: Where this registration stands in its round reports.
    cursor: ReportCursor = field(default_factory=ReportCursor)

    @property
    def alive(self) -> bool:
        """Whether the agent is heartbeating (not dead, left or finished)."""
        return self.record.state == ALIVE

    def view(self, now: float) -> MemberView:
        """The member as a view taken at monotonic time ``now`` shows it."""
        record = self.record
        return MemberView(
            agent_id=record.agent_id,
            state=record.state,
            address=record.address,
            metrics_address=record.metrics_address,
            joined_at=record.joined_at,
            changed_at=record.changed_at,
            incarnation=record.incarnation,
            heartbeat_age_s=round(now - self.last_seen, 3) if self.alive else None,
            assignment_epoch=self.assignment_epoch,
            stats=self.stats,
        )
