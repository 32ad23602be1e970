"""A fleet is one run: finished agents on a fake clock, round reports, the scenario's check,
and reports over real gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from airgossip.coordinator.client import CoordinatorClient, CoordinatorError
from airgossip.coordinator.convert import record_to_proto
from airgossip.coordinator.membership import LivenessSettings, Membership
from airgossip.coordinator.policy import TopologySpec, make_policy
from airgossip.coordinator.rounds import RoundStore
from airgossip.coordinator.run import REPORT_ESTIMATE_LIMIT, RunSpec, disagreements
from airgossip.coordinator.service import CoordinatorServer
from airgossip.coordinator.store import FleetStore, StoreError
from airgossip.coordinator.views import DEAD, FINISHED
from airgossip.edge.observability.stats import Counters, RoundRecord
from airgossip.protos import coordinator_pb2, coordinator_pb2_grpc
from tests.support.agents import FakeClock

LIVENESS = LivenessSettings(heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0)
SCENARIO = {"agents": 3, "rounds": 4, "algorithm": "push-sum", "task": {"name": "digits"},
            "network": {"loss": 0.0}, "device": "auto"}  # fmt: skip


def make_fleet(clock: FakeClock, db: Path | None = None) -> Membership:
    spec = TopologySpec("exponential")
    return Membership(
        expected=3, spec=spec, policy=make_policy(spec), store=FleetStore(db),
        liveness=LIVENESS, clock=clock, wall=clock, run=RunSpec("run-1", SCENARIO, 4),
    )  # fmt: skip


def record(agent_id: str, round: int, *, final: bool = False) -> RoundRecord:
    return RoundRecord(
        agent_id, round, wall_s=round * 0.1, metrics={"accuracy": 0.5 + round / 10},
        counters=Counters(messages_sent=2 * round), final=final,
        estimate=np.full(3, float(round)),
    )  # fmt: skip


def test_a_finished_agent_is_never_declared_dead_and_ends_the_run(tmp_path: Path) -> None:
    clock = FakeClock()
    fleet = make_fleet(clock, tmp_path / "fleet.db")
    for i in range(3):
        fleet.register(f"agent-{i}", f"10.0.0.{i}:7000", "digest", estimate_length=3)
    assert fleet.status().started_unix == pytest.approx(clock.now)
    for i in range(3):
        fleet.report(f"agent-{i}", [record(f"agent-{i}", r) for r in range(4)])
    fleet.report("agent-0", [record("agent-0", 4, final=True)])  # the final report
    fleet.leave("agent-1", "finished")  # or a Leave saying so
    assert fleet.members["agent-0"].record.state == FINISHED
    assert fleet.members["agent-1"].record.state == FINISHED
    # Finishing changes no graph: the neighbours' last messages may still be on the way.
    epoch = fleet.epoch
    assert epoch == 1 and set(fleet.assignments) == {"agent-0", "agent-1", "agent-2"}
    clock.now += 60.0  # finished agents fall silent; agent-2 too
    assert fleet.expire() == ["agent-2"]
    assert fleet.members["agent-0"].record.state == FINISHED
    status = fleet.status()
    assert status.complete and (status.finished, status.registered) == (2, 2)
    assert fleet.counters["failures"] == 1 and fleet.counters["finished"] == 2
    # A late heartbeat of a finished agent is no reason to register again.
    assert fleet.heartbeat("agent-0", None, epoch) == fleet.epoch
    records = fleet.run_records()
    assert [r.round for r in records["agent-0"]] == [0, 1, 2, 3, 4]
    assert records["agent-0"][-1].final

    fleet.store.close()  # a restarted coordinator keeps the run and what was reported
    again = make_fleet(clock, tmp_path / "fleet.db")
    assert again.run.run_id == "run-1" and again.status().complete
    kept = again.run_records()
    assert [r.round for r in kept["agent-0"]] == [0, 1, 2, 3, 4]
    assert np.array_equal(kept["agent-0"][2].estimate, np.full(3, 2.0))
    assert kept["agent-1"][3].counters.messages_sent == 6
    assert again.members["agent-2"].record.state == DEAD


def test_a_database_of_another_scenario_is_refused(tmp_path: Path) -> None:
    make_fleet(FakeClock(), tmp_path / "fleet.db").store.close()
    spec = TopologySpec("exponential")
    with pytest.raises(StoreError, match="holds run run-1 of another scenario"):
        Membership(expected=3, spec=spec, policy=make_policy(spec), store=FleetStore(tmp_path /
              "fleet.db"), run=RunSpec("run-2", {**SCENARIO, "rounds": 9}, 9))  # fmt: skip


def test_disagreements_name_each_setting() -> None:
    assert disagreements(SCENARIO, {}) == []
    assert disagreements(SCENARIO, {"agents": 3, "network": {"loss": 0}}) == []
    assert disagreements(SCENARIO, {"device": "cuda", "out": "x"}) == []  # each agent's own
    found = disagreements(
        SCENARIO, {"agents": 16, "task": {"name": "consensus"}, "algorithm": "dpsgd",
                   "network": {"loss": 0.1}, "staleness": 3}
    )  # fmt: skip
    assert found == [
        "agents = 16 here, 3 in the fleet",
        "task.name = 'consensus' here, 'digits' in the fleet",
        "algorithm = 'dpsgd' here, 'push-sum' in the fleet",
        "network.loss = 0.1 here, 0.0 in the fleet",
        "staleness = 3 here, not set in the fleet",
    ]


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    server = CoordinatorServer(
        expected=2, topology=TopologySpec("ring"), token="t", run=RunSpec("run-x", SCENARIO, 4)
    )
    server.start()
    yield server
    server.stop(grace_s=0)


def test_reports_over_grpc_and_the_refusal_of_a_disagreeing_agent(
    server: CoordinatorServer,
) -> None:
    client = CoordinatorClient(server.address, "agent-0", token="t")
    try:
        run = client.fetch_run({"rounds": 4})
        assert (run.run_id, run.expected_agents, run.rounds) == ("run-x", 2, 4)
        assert run.scenario == SCENARIO and not run.complete
        with pytest.raises(CoordinatorError) as info:
            client.fetch_run({"agents": 16, "rounds": 4})
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "agents = 16 here, 3 in the fleet" in info.value.reason
        client.register("127.0.0.1:7001", "digest", model_numel=3)
        # A report the coordinator refuses as it is (too many figures, past the run's last
        # round, an estimate of another length than the run's) is dropped, with a warning,
        # instead of blocking every later one.
        crowded = record("agent-0", 3)
        crowded.metrics = {f"m{i}": 1.0 for i in range(70)}
        # A large model travels as a sketch of REPORT_ESTIMATE_LIMIT values: not this run's.
        big = record("agent-0", 1)
        big.estimate = np.arange(4 * REPORT_ESTIMATE_LIMIT, dtype=np.float64)
        sketch = record_to_proto(big, estimate_limit=REPORT_ESTIMATE_LIMIT).estimate
        assert len(sketch) == 8 * REPORT_ESTIMATE_LIMIT
        for wrong in (crowded, record("agent-0", 5), big):
            client.record(wrong)
            client.send_reports()
            assert client.pending_reports() == 0
        assert server.round_records() == {} and server.latest_records() == {}
        # A figure that is no number is left out.
        odd = record("agent-0", 0)
        odd.metrics["note"] = "fine"  # type: ignore[assignment]
        for r in (odd, record("agent-0", 1), record("agent-0", 2, final=True)):
            client.record(r)
        client.send_reports()
        assert client.pending_reports() == 0
        held = server.round_records()["agent-0"]
        assert [r.round for r in held] == [0, 1, 2]
        assert held[1].estimate is not None and list(held[1].estimate) == [1.0] * 3
        assert held[2].metrics == {"accuracy": pytest.approx(0.7)}
        assert held[0].metrics == {"accuracy": pytest.approx(0.5)}
        # What a launcher polls for progress: the latest record, without its estimate.
        latest = server.latest_records()
        assert list(latest) == ["agent-0"]
        assert (latest["agent-0"].round, latest["agent-0"].final) == (2, True)
        assert latest["agent-0"].estimate is None
        assert latest["agent-0"].metrics == held[2].metrics
        assert {m.agent_id: m.state for m in server.view().members} == {"agent-0": FINISHED}
    finally:
        client.close()
    with grpc.insecure_channel(server.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        bad = coordinator_pb2.RoundReport(round=1, estimate=b"\0" * 12)
        with pytest.raises(grpc.RpcError) as error:
            stub.Report(coordinator_pb2.ReportRequest(agent_id="agent-0", token="t",
                                                      rounds=[bad]), timeout=5)  # fmt: skip
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        nan = coordinator_pb2.RoundReport(round=1, estimate=np.array([np.nan, 0, 0]).tobytes())
        with pytest.raises(grpc.RpcError) as error:
            stub.Report(coordinator_pb2.ReportRequest(agent_id="agent-0", token="t",
                                                      rounds=[nan]), timeout=5)  # fmt: skip
        assert "NaN" in (error.value.details() or "")
        with pytest.raises(grpc.RpcError) as error:  # a member that did not register
            stub.Report(coordinator_pb2.ReportRequest(agent_id="agent-1", token="t"), timeout=5)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as error:  # not a member of the run
            stub.Report(coordinator_pb2.ReportRequest(agent_id="ghost", token="t"), timeout=5)
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert [r.round for r in server.round_records()["agent-0"]] == [0, 1, 2]


def test_the_latest_records_are_each_agents_highest_round_without_its_estimate() -> None:
    store = FleetStore(None)
    try:
        rounds = RoundStore(store.database)
        assert rounds.latest() == {}
        rounds.add("agent-1", [record("agent-1", 3), record("agent-1", 1)])
        rounds.add("agent-0", [record("agent-0", 0)])
        again = record("agent-1", 3, final=True)  # a round held already is replaced
        rounds.add("agent-1", [again, record("agent-1", 2)])
        latest = rounds.latest()
        assert {a: (r.round, r.final) for a, r in latest.items()} == {
            "agent-0": (0, False), "agent-1": (3, True),
        }  # fmt: skip
        assert all(r.estimate is None for r in latest.values())
        assert rounds.records()["agent-1"][-1].estimate is not None  # kept, not read for it
    finally:
        store.close()
