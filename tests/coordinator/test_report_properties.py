"""Property: whatever Report and Heartbeat messages arrive (hypothesis draws them: any rounds
up to 2^64 - 1, any floats, NaN and infinities included, estimates of any length and any
bytes, figures and links by the dozen, known and unknown agents), a live coordinator answers
each with OK or a status that says why, never an unexpected error or a traceback, and what
it keeps stays within the run's bounds: one record per agent and round, one snapshot per
agent."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airgossip.coordinator.run import RunSpec
from airgossip.coordinator.service import CoordinatorServer, TopologySpec
from airgossip.protos import coordinator_pb2, coordinator_pb2_grpc

ROUNDS = 20
NUMEL = 4
AGENTS = ("agent-0", "agent-1")
#: What a refusal may be; UNKNOWN or INTERNAL would be an error the coordinator did not mean.
EXPECTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,  # an id that is not on the run's roster
}
U64 = st.one_of(st.integers(0, 64), st.integers(0, 2**64 - 1), st.sampled_from([2**63, 2**64 - 1]))
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
NAMES = st.one_of(st.text(max_size=8), st.text(min_size=60, max_size=70))
#: A report's figures: a few of any name and value, or more than a report may carry.
FIGURES = st.one_of(
    st.dictionaries(NAMES, FLOATS, max_size=3), st.just({f"m{i}": 0.5 for i in range(65)})
)


@st.composite
def estimates(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["right", "floats", "bytes", "none", "long"]))
    if kind == "none":
        return b""
    if kind == "long":  # a large model's sketch, in a run of a small one
        return np.zeros(4096, dtype="<f8").tobytes()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    count = NUMEL if kind == "right" else draw(st.sampled_from([0, 1, 3, 5]))
    values = draw(st.lists(FLOATS, min_size=count, max_size=count))
    return np.asarray(values, dtype="<f8").tobytes()


ROUND_REPORTS = st.builds(
    coordinator_pb2.RoundReport,
    round=st.one_of(st.integers(0, ROUNDS + 2), U64),
    wall_s=FLOATS,
    metrics=FIGURES,
    scalars=FIGURES,
    bytes_sent=U64,
    messages_received=U64,
    final=st.booleans(),
    estimate=estimates(),
)
AGENT_IDS = st.one_of(st.sampled_from([*AGENTS, "ghost"]), st.text(max_size=140))
REPORTS = st.builds(
    coordinator_pb2.ReportRequest,
    agent_id=AGENT_IDS,
    rounds=st.lists(ROUND_REPORTS, max_size=6),
)
LINKS = st.builds(
    coordinator_pb2.LinkStats, peer_id=st.one_of(st.sampled_from(AGENTS), NAMES),
    bytes_sent=U64, messages_sent=U64, messages_dropped=U64, messages_failed=U64,
)  # fmt: skip
STATS = st.builds(
    coordinator_pb2.AgentStats,
    round=U64, accuracy=FLOATS, loss=FLOATS, push_sum_weight=FLOATS, disagreement=FLOATS,
    bytes_sent=U64, messages_rejected=U64, links=st.lists(LINKS, max_size=5),
)  # fmt: skip
HEARTBEATS = st.builds(
    coordinator_pb2.HeartbeatRequest, agent_id=AGENT_IDS, stats=STATS, assignment_epoch=U64
)


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[CoordinatorServer, coordinator_pb2_grpc.CoordinatorStub]]:
    # No rate limits here: every message must reach the checks behind them.
    server = CoordinatorServer(
        expected=2, topology=TopologySpec("ring"), run=RunSpec("run-p", {}, ROUNDS),
        rate_limits={},
    )  # fmt: skip
    server.start()
    channel = grpc.insecure_channel(server.address)
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    for i, agent_id in enumerate(AGENTS):
        stub.Register(
            coordinator_pb2.RegisterRequest(
                agent_id=agent_id, address=f"127.0.0.1:{5000 + i}", fleet_digest="d",
                estimate_length=NUMEL,
            ),
            timeout=5,
        )  # fmt: skip
    yield server, stub
    channel.close()
    server.stop(grace_s=0)


def answered(call: object, request: object) -> None:
    try:
        call(request, timeout=10)  # type: ignore[operator]
    except grpc.RpcError as err:
        assert err.code() in EXPECTED, (err.code(), err.details())
        assert err.details() and "Traceback" not in err.details(), err.details()


def check_bounds(server: CoordinatorServer) -> None:
    records = server.round_records()
    assert set(records) <= set(AGENTS)
    for agent_records in records.values():
        rounds = [r.round for r in agent_records]
        assert len(rounds) == len(set(rounds)) <= ROUNDS + 1
        assert all(0 <= r <= ROUNDS for r in rounds)
        for record in agent_records:
            assert math.isfinite(record.wall_s)
            assert record.estimate is None or record.estimate.size == NUMEL
    view = server.view()
    assert {m.agent_id for m in view.members} == set(AGENTS)
    for member in view.members:
        assert member.stats is None or set(member.stats.links) <= set(AGENTS)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(requests=st.lists(st.one_of(REPORTS, HEARTBEATS), min_size=1, max_size=4))
def test_any_report_or_heartbeat_gets_a_status_and_keeps_within_bounds(
    live: tuple[CoordinatorServer, coordinator_pb2_grpc.CoordinatorStub],
    requests: list[coordinator_pb2.ReportRequest | coordinator_pb2.HeartbeatRequest],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, stub = live
    caplog.set_level(logging.WARNING)
    for request in requests:
        call = stub.Report if isinstance(request, coordinator_pb2.ReportRequest) else stub.Heartbeat
        answered(call, request)
    check_bounds(server)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
