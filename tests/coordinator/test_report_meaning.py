"""Round reports are checked for meaning, not only for shape: an accuracy outside [0, 1], a
negative loss or distance, a figure or estimate that is not finite, counters that go back
within a registration: the whole call is refused with INVALID_ARGUMENT and a line that says
what was wrong; over real gRPC, nothing of a refused call is stored and the refusal is
counted."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from airgossip.common.security.tls import COORDINATOR_IDENTITY, dial
from airgossip.coordinator.refusal import Refusal
from airgossip.coordinator.reports import ReportCursor, admit
from airgossip.coordinator.run import RunSpec
from airgossip.coordinator.service import CoordinatorServer, TopologySpec
from airgossip.edge.observability.stats import Counters, RoundRecord
from airgossip.protos import coordinator_pb2, coordinator_pb2_grpc
from tests.support.tls import credentials

NUMEL = 4
LAST = 50


def record(round_index: int, **fields: object) -> RoundRecord:
    fields.setdefault("metrics", {"accuracy": 0.5, "loss": 1.2})
    fields.setdefault("scalars", {"weight": 0.9, "disagreement": 0.01})
    fields.setdefault("estimate", np.ones(NUMEL))
    return RoundRecord("agent-1", round_index, 0.1 * round_index, **fields)  # type: ignore[arg-type]


def sent(messages: int, nbytes: int | None = None) -> Counters:
    return Counters(bytes_sent=100 * messages if nbytes is None else nbytes, messages_sent=messages)


def run_admit(
    records: list[RoundRecord], cursor: ReportCursor | None = None
) -> tuple[list[RoundRecord], ReportCursor]:
    return admit(
        "agent-1", records, cursor or ReportCursor(), last_round=LAST, estimate_length=NUMEL
    )


def refusal_of(records: list[RoundRecord], cursor: ReportCursor | None = None) -> Refusal:
    with pytest.raises(Refusal) as info:
        run_admit(records, cursor)
    assert info.value.code == "INVALID_ARGUMENT"
    assert "\n" not in info.value.reason
    return info.value


def test_honest_records_are_admitted_and_the_cursor_keeps_their_last_counters() -> None:
    fresh, cursor = run_admit([record(1, counters=sent(2)), record(2, counters=sent(4))])
    assert [r.round for r in fresh] == [1, 2]
    assert cursor.counters == sent(4)
    # Boundaries are fine: accuracy 0 and 1, zero loss, distance and counters; a user's own
    # figure may be negative.
    edge = record(3, metrics={"accuracy": 1.0, "val_accuracy": 0.0, "loss": 0.0, "r2": -3.0},
                  scalars={"disagreement": 0.0, "weight": 0.0}, counters=sent(4))  # fmt: skip
    fresh, cursor = run_admit([edge], cursor)
    assert [r.round for r in fresh] == [3]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"metrics": {"accuracy": 1e300}}, "metric 'accuracy' is 1e+300"),
        ({"metrics": {"accuracy": -0.01}}, "fraction in [0, 1]"),
        ({"metrics": {"accuracy": 1.0000001}}, "fraction in [0, 1]"),
        ({"metrics": {"accuracy": float("nan")}}, "must be finite"),
        ({"metrics": {"test_accuracy": 87.0}}, "metric 'test_accuracy'"),
        ({"metrics": {"loss": -1.0}}, "metric 'loss' is -1.0; it cannot be negative"),
        ({"metrics": {"train_loss": float("inf")}}, "must be finite"),
        ({"metrics": {"consensus_distance": -0.5}}, "cannot be negative"),
        ({"metrics": {"privacy_epsilon": -2.0}}, "cannot be negative"),
        ({"metrics": {"anything": float("-inf")}}, "must be finite"),
        ({"scalars": {"disagreement": -1e-9}}, "scalar 'disagreement'"),
        ({"scalars": {"weight": -0.5}}, "scalar 'weight'"),
        ({"scalars": {"y2": -1.0}}, "scalar 'y2'"),
        ({"scalars": {"gamma": float("nan")}}, "must be finite"),
        ({"estimate": np.array([1.0, np.nan, 0.0, 0.0])}, "estimate holds NaN or infinity"),
        ({"estimate": np.array([1.0, 0.0, np.inf, 0.0])}, "estimate holds NaN or infinity"),
        ({"counters": Counters(messages_received=-1)}, "messages_received is negative"),
    ],
)
def test_a_record_that_cannot_be_true_is_refused_with_what_was_wrong(
    fields: dict[str, object], says: str
) -> None:
    refusal = refusal_of([record(1), record(2, **fields), record(3)])
    assert refusal.reason.startswith("round 2: ") and says in refusal.reason


@pytest.mark.parametrize("wall_s", [float("nan"), float("inf"), -1.0])
def test_a_time_that_is_not_finite_or_negative_is_refused(wall_s: float) -> None:
    bad = record(1)
    bad.wall_s = wall_s
    assert "wall_s" in refusal_of([bad]).reason


@pytest.mark.parametrize("name", Counters.names())
def test_every_counter_going_back_within_a_call_is_refused(name: str) -> None:
    before, after = Counters(**{name: 10}), Counters(**{name: 9})
    refusal = refusal_of([record(1, counters=before), record(2, counters=after)])
    assert f"{name} went back from 10 to 9" in refusal.reason


def test_counters_going_back_from_one_call_to_the_next_are_refused() -> None:
    _, cursor = run_admit([record(1, counters=sent(5)), record(2, counters=sent(6))])
    refusal = refusal_of([record(3, counters=sent(6, nbytes=10))], cursor)
    assert "round 3: agent-1's bytes_sent went back from 600 to 10" in refusal.reason
    # Equal counters are fine (an agent that sent nothing that round), and so is a retried
    # call: what was held already is not checked against itself again.
    fresh, cursor = run_admit([record(3, counters=sent(6))], cursor)
    assert [r.round for r in fresh] == [3]
    fresh, after = run_admit([record(3, counters=sent(6)), record(4, counters=sent(9))], cursor)
    assert [r.round for r in fresh] == [4] and after.counters == sent(9)
    # A new registration starts with a fresh cursor: its counters may start anywhere.
    fresh, _ = run_admit([record(4, counters=sent(1))], ReportCursor())
    assert [r.round for r in fresh] == [4]


def test_a_refused_call_leaves_the_cursor_as_it_was() -> None:
    _, cursor = run_admit([record(1, counters=sent(5))])
    refusal_of([record(2, counters=sent(7)), record(3, metrics={"accuracy": 2.0})], cursor)
    fresh, _ = run_admit([record(2, counters=sent(6))], cursor)  # round 2 was not kept
    assert [r.round for r in fresh] == [2]


# -- over real gRPC, against a real coordinator --------------------------------------------------


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    server = CoordinatorServer(
        expected=2, topology=TopologySpec("ring"), security=credentials(COORDINATOR_IDENTITY),
        run=RunSpec("run-m", {"rounds": LAST}, LAST),
    )  # fmt: skip
    server.start()
    yield server
    server.stop(grace_s=0)


def test_a_report_of_accuracy_1e300_is_refused_over_grpc_and_nothing_of_it_is_stored(
    server: CoordinatorServer,
) -> None:
    channel = dial(server.address, COORDINATOR_IDENTITY, credentials("agent-1"))
    with channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        stub.Register(
            coordinator_pb2.RegisterRequest(
                agent_id="agent-1", address="127.0.0.1:4001", fleet_digest="d1",
                estimate_length=NUMEL,
            ),
            timeout=5,
        )  # fmt: skip
        estimate = np.ones(NUMEL).astype("<f8").tobytes()

        def report(round_index: int, accuracy: float, sent: int) -> coordinator_pb2.RoundReport:
            return coordinator_pb2.RoundReport(
                round=round_index, wall_s=0.1, metrics={"accuracy": accuracy},
                estimate=estimate, messages_sent=sent, bytes_sent=100 * sent,
            )  # fmt: skip

        def call(*rounds: coordinator_pb2.RoundReport) -> coordinator_pb2.ReportReply:
            request = coordinator_pb2.ReportRequest(agent_id="agent-1", rounds=rounds)
            reply: coordinator_pb2.ReportReply = stub.Report(request, timeout=5)
            return reply

        assert call(report(1, 0.5, 3)).rounds_held == 1
        for bad in (
            [report(2, 0.5, 4), report(3, 1e300, 5)],  # a good record beside does not save it
            [report(2, 0.5, 2)],  # the counters went back
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(*bad)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = info.value.details() or ""
            assert details.count("\n") == 0 and "Traceback" not in details
        assert "round 3: metric 'accuracy' is 1e+300" in _details_of(call, report(3, 1e300, 5))
        assert call(report(2, 0.6, 4)).rounds_held == 2  # the agent goes on reporting
    records = server.round_records()
    assert [(r.round, r.metrics["accuracy"]) for r in records["agent-1"]] == [(1, 0.5), (2, 0.6)]
    # What the coordinator's refusal metric (airgossip_coordinator_refusals_total) reads.
    refusals = server.servicer.refusals.snapshot()
    assert refusals[("Report", "invalid_argument")] == 3


def _details_of(call: object, *rounds: coordinator_pb2.RoundReport) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call(*rounds)  # type: ignore[operator]
    return info.value.details() or ""
