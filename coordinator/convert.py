"""Conversion between the edge's plain records and their protobuf forms."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from airgossip.common.topology import Assignment, Phase
from airgossip.coordinator.run import JsonObject
from airgossip.edge.observability.stats import Counters, RoundRecord, probe_estimate
from airgossip.edge.observability.telemetry import AgentSnapshot, LinkTotals
from airgossip.protos import coordinator_pb2


def assignment_to_proto(
    assignment: Assignment, *, ready: bool = True
) -> coordinator_pb2.Assignment:
    """An assignment as the coordinator streams it."""
    return coordinator_pb2.Assignment(
        epoch=assignment.epoch,
        ready=ready,
        peers=[coordinator_pb2.Peer(id=i, address=a) for i, a in assignment.peers.items()],
        schedule=[
            coordinator_pb2.Phase(
                self_weight=phase.self_weight,
                out_edges=[
                    coordinator_pb2.OutEdge(peer_id=p, weight=w)
                    for p, w in phase.out_weights.items()
                ],
                in_neighbours=list(phase.in_neighbours),
            )
            for phase in assignment.schedule
        ],
        lambda2=assignment.lambda2,
    )


def assignment_from_proto(proto: coordinator_pb2.Assignment) -> Assignment:
    """Raise ``ValueError`` for an assignment that is not usable (no phases, bad weights)."""
    if not proto.schedule:
        raise ValueError("assignment has no phases")
    schedule = tuple(
        Phase(
            self_weight=phase.self_weight,
            out_weights={edge.peer_id: edge.weight for edge in phase.out_edges},
            in_neighbours=tuple(phase.in_neighbours),
        )
        for phase in proto.schedule
    )
    return Assignment(
        epoch=proto.epoch,
        peers={peer.id: peer.address for peer in proto.peers},
        schedule=schedule,
        lambda2=proto.lambda2,
    )


def snapshot_to_proto(snapshot: AgentSnapshot) -> coordinator_pb2.AgentStats:
    """An agent's latest figures as its heartbeat carries them."""
    stats = coordinator_pb2.AgentStats(
        round=snapshot.round,
        **snapshot.counters.as_dict(),
        links=[
            coordinator_pb2.LinkStats(peer_id=peer, **vars(totals))
            for peer, totals in sorted(snapshot.links.items())
        ],
    )
    for name in ("accuracy", "loss", "push_sum_weight", "disagreement"):
        value = getattr(snapshot, name)
        if value is not None:
            setattr(stats, name, value)
    return stats


def snapshot_from_proto(stats: coordinator_pb2.AgentStats) -> AgentSnapshot:
    """Raise ``ValueError`` for figures that are not finite or links named twice."""
    optional: dict[str, float | None] = {}
    for name in ("accuracy", "loss", "push_sum_weight", "disagreement"):
        value = getattr(stats, name) if stats.HasField(name) else None
        if value is not None and not math.isfinite(value):
            raise ValueError(f"heartbeat figure '{name}' is not finite")
        optional[name] = value
    links: dict[str, LinkTotals] = {}
    for link in stats.links:
        if link.peer_id in links:
            raise ValueError(f"link to '{link.peer_id}' reported twice")
        links[link.peer_id] = LinkTotals(
            link.bytes_sent, link.messages_sent, link.messages_dropped, link.messages_failed
        )
    return AgentSnapshot(
        round=stats.round,
        counters=Counters.from_fields(stats),
        links=links,
        **optional,
    )


#: Most metrics or scalars one round report may name (a report is data, not a dump).
MAX_REPORT_FIGURES = 64
#: Largest counter a report may carry: what a signed 64-bit integer holds (SQLite, results).
MAX_COUNTER = 2**63 - 1


def record_to_proto(record: RoundRecord, *, estimate_limit: int) -> coordinator_pb2.RoundReport:
    """A round record as its agent reports it; the estimate as :func:`probe_estimate` of it
    with at most ``estimate_limit`` elements."""
    report = coordinator_pb2.RoundReport(
        round=record.round,
        wall_s=record.wall_s,
        metrics=_numbers(record.metrics),
        scalars=_numbers(record.scalars),
        final=record.final,
    )
    for name, value in record.counters.as_dict().items():
        setattr(report, name, value)
    if record.estimate is not None:
        probe = probe_estimate(
            record.estimate, 0, limit=estimate_limit, buckets=estimate_limit
        ).astype("<f8", copy=False)
        report.estimate = probe.tobytes()
    return report


def _numbers(figures: dict[str, float]) -> dict[str, float]:
    """The figures that are numbers (a user's task may report anything)."""
    return {
        k: float(v)
        for k, v in figures.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def record_from_proto(agent_id: str, report: coordinator_pb2.RoundReport) -> RoundRecord:
    """Raise ``ValueError`` for a report that is not usable (too many figures, figures or a
    time that are not finite, counters past 2^63 - 1, an estimate that is not whole float64
    values)."""
    where = f"round {report.round}"
    for name in ("metrics", "scalars"):
        figures = getattr(report, name)
        if len(figures) > MAX_REPORT_FIGURES or any(len(k) > 64 for k in figures):
            raise ValueError(
                f"{where}: at most {MAX_REPORT_FIGURES} {name}, names of at most 64 characters"
            )
        if not all(math.isfinite(v) for v in figures.values()):
            raise ValueError(f"{where}: {name} must be finite numbers")
    if not (math.isfinite(report.wall_s) and report.wall_s >= 0):
        raise ValueError(f"{where}: wall_s must be a finite number of seconds, at least 0")
    counters = Counters.from_fields(report)
    if max(counters.as_dict().values()) > MAX_COUNTER:
        raise ValueError(f"{where}: counters must be at most {MAX_COUNTER}")
    estimate = None
    if report.estimate:
        if len(report.estimate) % 8:
            raise ValueError(f"round {report.round}: estimate is not whole float64 values")
        estimate = np.frombuffer(report.estimate, dtype="<f8").astype(np.float64)
    return RoundRecord(
        agent_id=agent_id,
        round=int(report.round),
        wall_s=float(report.wall_s),
        metrics=dict(report.metrics),
        scalars=dict(report.scalars),
        final=bool(report.final),
        estimate=estimate,
        counters=counters,
    )


@dataclass(frozen=True)
class RunInfo:
    """The run as the coordinator describes it (see ``RunReply`` in coordinator.proto)."""

    run_id: str
    scenario: JsonObject | None
    expected_agents: int
    rounds: int
    started_unix: float | None
    registered: int
    finished: int
    complete: bool
    #: The round the run's agents have reached (0: none reported yet).
    fleet_round: int = 0

    @classmethod
    def from_proto(cls, reply: coordinator_pb2.RunReply) -> RunInfo:
        """The run a ``RunReply`` describes."""
        scenario = json.loads(reply.scenario_json) if reply.scenario_json else None
        return cls(
            run_id=reply.run_id,
            scenario=scenario if isinstance(scenario, dict) else None,
            expected_agents=reply.expected_agents,
            rounds=reply.rounds,
            started_unix=reply.started_unix or None,
            registered=reply.registered_agents,
            finished=reply.finished_agents,
            complete=reply.complete,
            fleet_round=reply.fleet_round,
        )
