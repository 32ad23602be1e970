"""An authenticated insider's reports and heartbeats against a live coordinator (real gRPC,
mutual TLS): every attack of the issue is refused with its status and a message, nothing of
it is kept, the run's results are still summarised, and one identity's flood of calls is cut
to its rate."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from airgossip.common.security.tls import COORDINATOR_IDENTITY, dial
from airgossip.coordinator.client import CoordinatorClient
from airgossip.coordinator.limits import call_limits
from airgossip.coordinator.retry import RETRY_AFTER_KEY
from airgossip.coordinator.run import MAX_REPORTS_PER_CALL, RunSpec
from airgossip.coordinator.service import CoordinatorServer, TopologySpec
from airgossip.protos import coordinator_pb2, coordinator_pb2_grpc
from airgossip.scenario.results import summarise
from tests.support.tls import credentials

ROUNDS = 50
NUMEL = 100


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    server = CoordinatorServer(
        expected=2, topology=TopologySpec("ring"), security=credentials(COORDINATOR_IDENTITY),
        run=RunSpec("run-h", {"rounds": ROUNDS}, ROUNDS),
    )  # fmt: skip
    server.start()
    yield server
    server.stop(grace_s=0)


def insider_registration(estimate_length: int = NUMEL) -> coordinator_pb2.RegisterRequest:
    """agent-1's registration, as the insider sends it."""
    return coordinator_pb2.RegisterRequest(
        agent_id="agent-1", address="127.0.0.1:4001", fleet_digest="d1",
        estimate_length=estimate_length,
    )  # fmt: skip


@pytest.fixture
def insider(server: CoordinatorServer) -> Iterator[coordinator_pb2_grpc.CoordinatorStub]:
    """agent-1's real certificate, in the hands of whoever took over its device."""
    honest = CoordinatorClient(server.address, "agent-0", security=credentials("agent-0"))
    honest.register("127.0.0.1:4000", "d1", model_numel=NUMEL, timeout_s=10)
    channel = dial(server.address, COORDINATOR_IDENTITY, credentials("agent-1"))
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    stub.Register(insider_registration(), timeout=5)
    honest_reports(honest)
    yield stub
    channel.close()
    honest.close()


def honest_reports(client: CoordinatorClient) -> None:
    from airgossip.edge.observability.stats import RoundRecord

    for r in range(3):
        client.record(
            RoundRecord("agent-0", r, 0.1 * r, {"accuracy": 0.5}, estimate=np.ones(NUMEL))
        )
    client.send_reports()


def report(
    round_index: int, elements: int = NUMEL, **fields: object
) -> coordinator_pb2.RoundReport:
    fields.setdefault("estimate", np.full(elements, 2.0).astype("<f8").tobytes())
    return coordinator_pb2.RoundReport(round=round_index, **fields)  # type: ignore[arg-type]


def refused(
    stub: coordinator_pb2_grpc.CoordinatorStub, *rounds: coordinator_pb2.RoundReport
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        stub.Report(coordinator_pb2.ReportRequest(agent_id="agent-1", rounds=rounds), timeout=5)
    details = info.value.details() or ""
    assert details and "Traceback" not in details
    return info.value


def test_every_report_attack_is_refused_with_a_status_and_nothing_is_kept(
    server: CoordinatorServer,
    insider: coordinator_pb2_grpc.CoordinatorStub,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    # A 4,096-element estimate for a 100-element run (it broke the results before).
    wrong = refused(insider, report(1, elements=4096))
    assert wrong.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "4096 elements; the run's estimates have 100" in (wrong.details() or "")
    # Made-up rounds, up to what SQLite cannot hold.
    for round_index in (ROUNDS + 1, 10_004_499, 2**63, 2**64 - 1):
        past = refused(insider, report(round_index))
        assert past.code() == grpc.StatusCode.OUT_OF_RANGE
        assert f"past the run's last round {ROUNDS}" in (past.details() or "")
    # Non-finite figures, a figure too many, rounds out of order, too many in one call.
    for bad in (
        [report(1, wall_s=float("nan"))],
        [report(1, metrics={"accuracy": float("inf")})],
        [report(1, scalars={f"s{i}": 1.0 for i in range(65)})],
        [report(2), report(1)],
        [report(1, estimate=b"\0" * 12)],
    ):
        assert refused(insider, *bad).code() == grpc.StatusCode.INVALID_ARGUMENT, bad
    too_many = [report(r % ROUNDS, elements=0) for r in range(MAX_REPORTS_PER_CALL + 1)]
    assert refused(insider, *too_many).code() == grpc.StatusCode.INVALID_ARGUMENT
    # Forward only within one registration; a call retried because its reply was lost is
    # taken as received again (nothing stored twice); a restarted agent registers again and
    # may report from where it resumed.
    held = insider.Report(
        coordinator_pb2.ReportRequest(agent_id="agent-1", rounds=[report(5), report(6)]),
        timeout=5,
    ).rounds_held
    assert held == 2
    retried = insider.Report(
        coordinator_pb2.ReportRequest(agent_id="agent-1", rounds=[report(5), report(6), report(7)]),
        timeout=5,
    )
    assert retried.rounds_held == 3
    back = refused(insider, report(4))
    assert back.code() == grpc.StatusCode.FAILED_PRECONDITION and "only move forward" in (
        back.details() or ""
    )
    insider.Register(insider_registration(), timeout=5)
    again = insider.Report(
        coordinator_pb2.ReportRequest(agent_id="agent-1", rounds=[report(4, wall_s=9.0)]),
        timeout=5,
    )
    assert again.rounds_held == 4
    # A registration that declares another estimate length, or one past the limit.
    for length, code in (
        (50, grpc.StatusCode.FAILED_PRECONDITION),
        (5000, grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.RpcError) as info:
            insider.Register(insider_registration(length), timeout=5)
        assert info.value.code() == code

    records = server.round_records()
    assert [r.round for r in records["agent-1"]] == [4, 5, 6, 7]
    assert all(
        r.estimate is not None and r.estimate.size == NUMEL for rs in records.values() for r in rs
    )
    results = summarise(records)  # what broke with a broadcast error before
    assert results.final.round == 7 and results.final.agents_reporting == 2
    refusals = server.view()  # the coordinator still answers and nobody moved
    assert {m.agent_id: m.state for m in refusals.members} == {
        "agent-0": "alive",
        "agent-1": "alive",
    }
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def test_one_identity_flooding_heartbeats_and_reports_is_cut_to_its_rate(
    server: CoordinatorServer, insider: coordinator_pb2_grpc.CoordinatorStub
) -> None:
    limits = call_limits(server.liveness.heartbeat_interval_s)
    for method, call, request in (
        ("Heartbeat", insider.Heartbeat, coordinator_pb2.HeartbeatRequest(agent_id="agent-1")),
        ("Report", insider.Report, coordinator_pb2.ReportRequest(agent_id="agent-1")),
    ):
        accepted = exhausted = 0
        started = time.monotonic()
        for _ in range(400):
            try:
                call(request, timeout=5)
                accepted += 1
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                assert "calls too often" in (err.details() or "")
                assert any(k == RETRY_AFTER_KEY for k, _ in err.trailing_metadata() or ())
                exhausted += 1
        elapsed = time.monotonic() - started
        limit = limits[method]
        assert accepted <= limit.burst + limit.per_second * elapsed + 1, (method, accepted)
        assert exhausted >= 400 - accepted and exhausted > 0
    # The honest agent's heartbeats are its own bucket: untouched by the insider's flood.
    channel = dial(server.address, COORDINATOR_IDENTITY, credentials("agent-0"))
    with channel:
        coordinator_pb2_grpc.CoordinatorStub(channel).Heartbeat(
            coordinator_pb2.HeartbeatRequest(agent_id="agent-0"), timeout=5
        )
