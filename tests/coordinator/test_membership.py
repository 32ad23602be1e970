"""Fleet membership on a fake clock: liveness, repair, rejoin, persistence across restarts."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from airgossip.common.topology import is_strongly_connected
from airgossip.coordinator.membership import LivenessSettings, Membership, Refusal
from airgossip.coordinator.policy import TopologySpec, make_policy
from airgossip.coordinator.roster import Roster
from airgossip.coordinator.store import FleetStore, StoreError
from airgossip.coordinator.views import DEAD, LEFT, MemberView
from airgossip.edge.observability.telemetry import AgentSnapshot, LinkTotals
from tests.support.agents import FakeClock

LIVENESS = LivenessSettings(heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0)


def make_fleet(
    spec: TopologySpec,
    clock: FakeClock,
    db: Path | None = None,
    expected: int = 6,
    roster: Roster | None = None,
) -> Membership:
    return Membership(
        expected=expected, spec=spec, policy=make_policy(spec), store=FleetStore(db),
        liveness=LIVENESS, clock=clock, wall=clock, roster=roster,
    )  # fmt: skip


def register_all(fleet: Membership, n: int) -> None:
    for i in range(n):
        fleet.register(f"agent-{i}", f"10.0.0.{i}:7000", "digest", f"10.0.0.{i}:9100")


def out_edges(fleet: Membership) -> set[tuple[str, str]]:
    return {
        (agent_id, peer)
        for agent_id, assignment in fleet.assignments.items()
        for phase in assignment.schedule
        for peer in phase.out_weights
    }


def assert_strongly_connected_over(fleet: Membership, alive: set[str]) -> None:
    import numpy as np

    ids = sorted(alive)
    assert set(fleet.assignments) == alive
    a = np.zeros((len(ids), len(ids)), dtype=bool)
    for u, v in out_edges(fleet):
        assert u in alive and v in alive, (u, v)
        a[ids.index(u), ids.index(v)] = True
    assert is_strongly_connected(a)


def registration(member: MemberView) -> tuple[object, ...]:
    """What a coordinator must keep across a restart (heartbeat figures are volatile)."""
    m = member
    return (m.agent_id, m.state, m.address, m.metrics_address, m.joined_at, m.changed_at,
            m.incarnation)  # fmt: skip


def test_release_then_expiry_exactly_at_the_timeout() -> None:
    clock = FakeClock()
    fleet = make_fleet(TopologySpec("exponential"), clock)
    register_all(fleet, 5)
    assert not fleet.released and fleet.epoch == 0
    fleet.register("agent-5", "10.0.0.5:7000", "digest")
    assert fleet.released and fleet.epoch == 1 and len(fleet.assignments) == 6

    clock.now += 2.0
    for i in (0, 1, 3, 4):
        fleet.heartbeat(f"agent-{i}", AgentSnapshot(round=3), assignment_epoch=1)
    clock.now += 3.0  # agents 2 and 5 silent for exactly the timeout: not yet
    assert fleet.expire() == []
    assert fleet.next_expiry() == pytest.approx(1000.0 + 5.0)
    clock.now += 0.01
    assert sorted(fleet.expire()) == ["agent-2", "agent-5"]
    assert fleet.epoch == 2
    assert fleet.members["agent-2"].record.state == DEAD
    assert fleet.members["agent-2"].record.changed_at == pytest.approx(1005.01)
    assert_strongly_connected_over(fleet, {"agent-0", "agent-1", "agent-3", "agent-4"})
    assert fleet.counters["failures"] == 2

    with pytest.raises(Refusal) as info:
        fleet.heartbeat("agent-2", None, 1)
    assert info.value.code == "NOT_FOUND" and "register again" in info.value.reason


def test_a_returning_agent_rejoins_under_its_id_with_its_edges_back() -> None:
    clock = FakeClock()
    fleet = make_fleet(TopologySpec("exponential"), clock)
    register_all(fleet, 6)
    original = out_edges(fleet)
    clock.now += 6
    for i in range(1, 6):
        fleet.heartbeat(f"agent-{i}", None, 1)
    assert fleet.expire() == ["agent-0"]
    epoch = fleet.register("agent-0", "10.0.0.99:7001", "digest", "10.0.0.99:9100")
    assert epoch == 3
    member = fleet.members["agent-0"]
    assert member.alive and member.record.incarnation == 2
    assert out_edges(fleet) == original
    assert {a.peers.get("agent-0") for a in fleet.assignments.values()} >= {"10.0.0.99:7001"}
    # Re-registering from the same address changes nothing.
    assert fleet.register("agent-0", "10.0.0.99:7001", "digest", "10.0.0.99:9100") == 3


def test_leave_repairs_and_static_fleets_refuse_strangers() -> None:
    clock = FakeClock()
    fleet = make_fleet(TopologySpec("ring"), clock, roster=Roster.anyone())
    register_all(fleet, 6)
    fleet.leave("agent-3")
    assert fleet.members["agent-3"].record.state == LEFT
    assert_strongly_connected_over(fleet, {f"agent-{i}" for i in (0, 1, 2, 4, 5)})
    with pytest.raises(Refusal) as info:
        fleet.register("agent-77", "10.0.0.77:7000", "digest")
    assert info.value.code == "RESOURCE_EXHAUSTED"
    with pytest.raises(Refusal) as info:
        fleet.register("agent-3", "10.0.0.3:7000", "another-task")
    assert info.value.code == "FAILED_PRECONDITION"


def test_k_out_fleets_take_newcomers() -> None:
    clock = FakeClock()
    fleet = make_fleet(
        TopologySpec("k-out", out_degree=2), clock, expected=4, roster=Roster.parse("0..15")
    )
    register_all(fleet, 4)
    fleet.register("agent-10", "10.0.0.10:7000", "digest")
    assert fleet.epoch == 2
    assert_strongly_connected_over(fleet, {"agent-0", "agent-1", "agent-2", "agent-3", "agent-10"})


def test_heartbeat_stats_keep_only_links_to_members() -> None:
    clock = FakeClock()
    fleet = make_fleet(TopologySpec("ring"), clock, expected=2)
    register_all(fleet, 2)
    links = {"agent-1": LinkTotals(100, 2, 1, 0), "intruder": LinkTotals(5, 5, 5, 5)}
    fleet.heartbeat("agent-0", AgentSnapshot(round=4, accuracy=0.5, links=links), 1)
    stats = fleet.members["agent-0"].stats
    assert stats is not None and set(stats.links) == {"agent-1"} and stats.accuracy == 0.5
    assert fleet.members["agent-0"].assignment_epoch == 1


@pytest.mark.parametrize("topology", ["exponential", "k-out", "one-peer-exponential"])
def test_restart_on_the_same_database_loses_nothing(topology: str, tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    spec = TopologySpec(topology, seed=4)
    clock = FakeClock()
    fleet = make_fleet(spec, clock, db)
    twin = make_fleet(spec, FakeClock())  # the same events without a restart, in memory
    for f in (fleet, twin):
        register_all(f, 6)
        f.clock.now += 6  # type: ignore[attr-defined]
        for i in (0, 1, 2, 4, 5):
            f.heartbeat(f"agent-{i}", None, 1)
        assert f.expire() == ["agent-3"]
    before = fleet.view()
    fleet.store.close()

    restarted = make_fleet(spec, FakeClock(), db)
    assert restarted.restored
    after = restarted.view()
    assert after.epoch == before.epoch == 2
    assert [registration(m) for m in after.members] == [registration(m) for m in before.members]
    assert [m.state for m in after.members].count(DEAD) == 1
    assert restarted.assignments == fleet.assignments
    assert after.edges == before.edges
    # The policy goes on exactly as the uninterrupted twin does.
    for f in (restarted, twin):
        f.register("agent-3", "10.0.0.3:7000", "digest")
    assert restarted.assignments == twin.assignments


def test_the_database_is_private_and_a_damaged_one_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "state" / "fleet.db"
    fleet = make_fleet(TopologySpec("ring"), FakeClock(), db)
    register_all(fleet, 6)
    fleet.store.close()
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700  # created by the coordinator
    for path in db.parent.iterdir():  # the database, its WAL and shared memory
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    db.chmod(0o644)
    FleetStore(db).close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600  # taken back down
    page = 4096
    data = bytearray(db.read_bytes())
    assert len(data) > 3 * page
    data[2 * page : 3 * page] = bytes(range(256)) * (page // 256)  # one page overwritten
    db.write_bytes(bytes(data))
    for sidecar in db.parent.glob("fleet.db-*"):
        sidecar.unlink()
    with pytest.raises(StoreError, match=r"is damaged .*restore it from a backup.*another --db"):
        FleetStore(db)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(StoreError, match=r"writable by every user .*0700"):
        FleetStore(shared / "fleet.db")


def test_store_errors_say_what_is_wrong(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match=r"junk\.db is damaged \(file is not a database\)"):
        FleetStore(junk)
    db = tmp_path / "fleet.db"
    make_fleet(TopologySpec("ring"), FakeClock(), db).store.close()
    with pytest.raises(StoreError, match=r"holds a fleet of 6 agents on topology .*ring"):
        make_fleet(TopologySpec("exponential"), FakeClock(), db)
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99"):
        FleetStore(db)


def test_liveness_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="at least twice the interval"):
        LivenessSettings(heartbeat_interval_s=2, heartbeat_timeout_s=3)
    with pytest.raises(ValueError, match="interval"):
        LivenessSettings(heartbeat_interval_s=0)


def test_an_emulator_replaces_the_edge_list_at_run_time() -> None:
    clock = FakeClock()
    ring = tuple((i, (i + 1) % 4) for i in range(4))
    fleet = make_fleet(TopologySpec("edges", edges=ring), clock, expected=4)
    register_all(fleet, 4)
    assert out_edges(fleet) == {(f"agent-{i}", f"agent-{(i + 1) % 4}") for i in range(4)}
    star = [("agent-0", f"agent-{i}") for i in (1, 2, 3)] + [
        (f"agent-{i}", "agent-0") for i in (1, 2, 3)
    ]
    assert fleet.set_edges(star) == 2
    assert out_edges(fleet) == set(star)
    assert fleet.assignments["agent-2"].peers == {"agent-0": "10.0.0.0:7000"}
    other = make_fleet(TopologySpec("ring"), FakeClock(), expected=4)
    register_all(other, 4)
    with pytest.raises(Refusal, match="need topology 'edges'"):
        other.set_edges(star)
