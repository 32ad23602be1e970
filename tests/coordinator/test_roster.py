"""The run's roster and who fixes the run's task digest (issue 33, item 2), on a fake clock.

Only the identities the run expects register; one that is not expected is refused and
changes nothing. The task digest and the estimates' length are held by the live and
finished members: a member that registered with another task and then died releases them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airgossip.coordinator.membership import LivenessSettings, Membership, Refusal
from airgossip.coordinator.policy import TopologySpec, make_policy
from airgossip.coordinator.roster import Roster
from airgossip.coordinator.store import FleetStore
from airgossip.coordinator.views import DEAD, FINISHED
from airgossip.edge.observability.stats import RoundRecord
from tests.support.agents import FakeClock

LIVENESS = LivenessSettings(heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0)
GENUINE = "0123456789abcdef"


def make_fleet(
    clock: FakeClock, expected: int = 4, roster: Roster | None = None, db: Path | None = None
) -> Membership:
    spec = TopologySpec("ring")
    return Membership(
        expected=expected, spec=spec, policy=make_policy(spec), store=FleetStore(db),
        liveness=LIVENESS, clock=clock, wall=clock, roster=roster,
    )  # fmt: skip


def join(fleet: Membership, i: int, digest: str = GENUINE, length: int = 8) -> int:
    return fleet.register(f"agent-{i}", f"10.0.0.{i}:7000", digest, estimate_length=length)


# -- the roster --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "ids", "described"),
    [
        ("0..3", {"agent-0", "agent-1", "agent-2", "agent-3"}, "agent-0..agent-3"),
        ("agent-0..agent-1, pi-kitchen", {"agent-0", "agent-1", "pi-kitchen"},
         "agent-0..agent-1, pi-kitchen"),
        ("node-4..node-5,agent-7", {"node-4", "node-5", "agent-7"}, "agent-7, node-4, node-5"),
        ("agent-0,agent-2,agent-3", {"agent-0", "agent-2", "agent-3"},
         "agent-0, agent-2..agent-3"),
    ],
)  # fmt: skip
def test_a_roster_is_ids_and_ranges(text: str, ids: set[str], described: str) -> None:
    roster = Roster.parse(text)
    assert roster.ids == frozenset(ids) and roster.describe() == described
    assert all(roster.admits(i) for i in ids) and not roster.admits("mallory")


def test_a_roster_from_a_file_any_and_the_default(tmp_path: Path) -> None:
    listed = tmp_path / "roster.txt"
    listed.write_text("# the kitchen's boards\npi-kitchen, pi-hall\n0..1  # and two more\n")
    listed_ids = frozenset({"pi-kitchen", "pi-hall", "agent-0", "agent-1"})
    assert Roster.parse(f"@{listed}").ids == listed_ids
    anyone = Roster.parse(" any ")
    assert anyone.open and anyone.admits("mallory") and anyone.describe() == "any identity"
    assert Roster.indexed(40).describe() == "agent-0..agent-39"
    assert Roster.parse("0..99").describe(limit=1) == "agent-0..agent-99"
    many = Roster.parse(",".join(f"n{i}x" for i in range(9)))
    assert many.describe() == "n0x, n1x, n2x, n3x, n4x, n5x, ... (9 ids)"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "names no agent id"),
        (" , ", "names no agent id"),
        ("3..1", "runs backwards"),
        ("a..b", "is not a range"),
        ("agent-0..node-3", "is not a range"),
        ("bad id", "is not an agent id"),
        ("-x", "is not an agent id"),
        ("0..70000", "more than 65536"),
        ("@/nonexistent/roster.txt", "roster file /nonexistent/roster.txt: No such file"),
    ],
)
def test_a_bad_roster_is_one_line_naming_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        Roster.parse(text)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_roster_smaller_than_the_fleet_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match=r"names 3 agents \(agent-0..agent-2\); the run waits"):
        make_fleet(FakeClock(), expected=4, roster=Roster.parse("0..2"))


# -- who registers -----------------------------------------------------------------------------
def test_a_non_member_is_refused_and_changes_nothing() -> None:
    fleet = make_fleet(FakeClock())
    before = dict(fleet.counters)
    for digest, length in (("", 0), (GENUINE, 8)):
        with pytest.raises(Refusal) as info:
            fleet.register("mallory", "10.6.6.6:7000", digest, estimate_length=length)
        assert info.value.code == "PERMISSION_DENIED"
        assert info.value.reason.startswith(
            "'mallory' is not a member of this run (roster: agent-0..agent-3)"
        )
    with pytest.raises(Refusal):
        join(fleet, 4)  # one past the run's agents
    assert fleet.members == {} and fleet.counters == before
    assert fleet.estimate_length is None and fleet.store.load().members == {}  # type: ignore[union-attr]
    for i in range(4):  # the run's agents then fill it as if nothing happened
        join(fleet, i)
    assert fleet.released and fleet.alive_ids() == ("agent-0", "agent-1", "agent-2", "agent-3")


def test_an_open_roster_admits_anyone_when_asked() -> None:
    fleet = make_fleet(FakeClock(), expected=2, roster=Roster.anyone())
    fleet.register("pi-kitchen", "10.0.0.9:7000", GENUINE)
    assert "pi-kitchen" in fleet.members and fleet.view().roster == "any identity"


# -- who fixes the digest ----------------------------------------------------------------------
def test_a_dead_member_with_another_task_releases_the_digest_and_length() -> None:
    clock = FakeClock()
    fleet = make_fleet(clock)
    join(fleet, 3, digest="", length=0)  # a member's bogus registration, never followed up
    with pytest.raises(Refusal) as info:  # while it is alive, it holds the run's digest
        join(fleet, 0)
    assert info.value.code == "FAILED_PRECONDITION"
    assert "the fleet's is '', held by agent-3" in info.value.reason
    clock.now += LIVENESS.heartbeat_timeout_s + 0.1
    assert fleet.expire() == ["agent-3"] and fleet.members["agent-3"].record.state == DEAD
    for i in range(4):  # agent-3 comes back genuine too
        join(fleet, i)
    assert fleet.released and fleet.estimate_length == 8
    assert {m.record.digest for m in fleet.members.values()} == {GENUINE}
    with pytest.raises(Refusal, match="different task"):
        fleet.register("agent-3", "10.0.0.3:7000", "", estimate_length=8)


def test_a_member_that_left_releases_the_digest_too() -> None:
    fleet = make_fleet(FakeClock())
    join(fleet, 1, digest="other-task", length=3)
    fleet.leave("agent-1")
    join(fleet, 0)
    assert fleet.estimate_length == 8


def test_a_finished_member_keeps_the_digest_and_kept_rounds_keep_the_length() -> None:
    clock = FakeClock()
    fleet = make_fleet(clock, expected=2, roster=Roster.parse("0..3"))
    join(fleet, 0)
    join(fleet, 1)
    fleet.report("agent-0", [RoundRecord("agent-0", 0, 0.0, final=True)])
    assert fleet.members["agent-0"].record.state == FINISHED
    clock.now += LIVENESS.heartbeat_timeout_s + 0.1
    assert fleet.expire() == ["agent-1"]
    with pytest.raises(Refusal, match="held by agent-0"):  # the finished one holds it
        join(fleet, 2, digest="other-task")
    # Only a finished member is left: a newcomer of the run's task and length still joins
    # (a static ring takes no newcomer, so agent-1 rejoins), and the length stays bound to
    # the rounds kept.
    join(fleet, 1)
    assert fleet.estimate_length == 8


def test_kept_rounds_bind_the_length_once_every_member_is_gone() -> None:
    clock = FakeClock()
    fleet = make_fleet(clock, expected=2)
    join(fleet, 0)
    join(fleet, 1)
    fleet.report("agent-0", [RoundRecord("agent-0", 0, 0.0)])
    clock.now += LIVENESS.heartbeat_timeout_s + 0.1
    assert sorted(fleet.expire()) == ["agent-0", "agent-1"]
    with pytest.raises(Refusal, match="reports estimates of 3 elements; the run's have 8"):
        join(fleet, 0, digest="other-task", length=3)
    join(fleet, 0, digest="other-task", length=8)  # the digest was free; the length is not
    assert fleet.estimate_length == 8


def test_the_released_length_is_fixed_again_in_the_database(tmp_path: Path) -> None:
    clock = FakeClock()
    db = tmp_path / "fleet.db"
    fleet = make_fleet(clock, db=db)
    join(fleet, 2, digest="", length=0)
    clock.now += LIVENESS.heartbeat_timeout_s + 0.1
    fleet.expire()
    join(fleet, 0)
    fleet.store.close()
    restarted = make_fleet(FakeClock(), db=db)
    assert restarted.restored and restarted.estimate_length == 8
