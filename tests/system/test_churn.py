"""Crashes as real processes see them (SIGKILL): agents that die and come back, and a
coordinator that dies and comes back on its database, while the fleet keeps training."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

from tests.support.local_fleet import LocalFleet

pytestmark = pytest.mark.slow


@pytest.fixture
def fleets() -> Iterator[list[LocalFleet]]:
    made: list[LocalFleet] = []
    yield made
    for fleet in made:
        fleet.close()


def strongly_connected(edges: list[list[str]], nodes: set[str]) -> bool:
    graph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from(tuple(e) for e in edges)
    return set(graph.nodes) == nodes and nx.is_strongly_connected(graph)


def failed_sends(fleet: LocalFleet, indices: list[int]) -> dict[int, int]:
    return {i: fleet.latest(i).counters.messages_failed for i in indices}  # type: ignore[union-attr]


@pytest.mark.timeout(600)
def test_two_of_eight_agents_killed_then_restarted(
    fleets: list[LocalFleet], tmp_path: Path
) -> None:
    fleet = LocalFleet(tmp_path, agents=8, topology=["--topology", "k-out", "--out-degree", "2"])
    fleets.append(fleet)
    fleet.start_coordinator()
    for i in range(8):
        fleet.start_agent(i)
    everyone = list(range(8))
    fleet.wait(lambda: all(fleet.round_of(i) >= 6 for i in everyone), 300, "all 8 to train")
    epoch_before = fleet.fleet()["epoch"]

    victims, survivors = [2, 5], [0, 1, 3, 4, 6, 7]
    killed = {i: fleet.kill_agent(i) for i in victims}

    # The coordinator notices within the heartbeat timeout...
    members = fleet.wait(
        lambda: (m := fleet.members())
        and all(m[f"agent-{i}"]["state"] == "dead" for i in victims)
        and m,
        30, "the coordinator to declare both dead",
    )  # fmt: skip
    lags = {i: members[f"agent-{i}"]["changed_at"] - killed[i] for i in victims}
    print(f"detection lag after kill -9 (timeout {fleet.timeout} s): {lags}")
    assert all(0 < lag <= fleet.timeout + 1.0 for lag in lags.values()), lags
    view = fleet.fleet()
    assert view["counters"]["failures"] == 2, "a survivor was evicted too"
    # ...and the survivors' graph is repaired, strongly connected and theirs alone.
    alive = {f"agent-{i}" for i in survivors}
    assert view["epoch"] > epoch_before
    assert all(set(e) <= alive for phase in view["edges"] for e in phase), view["edges"]
    assert strongly_connected(view["edges"][0], alive)
    assert view["strongly_connected"] is True
    repaired = view["epoch"]
    fleet.wait(
        lambda: all(
            fleet.members()[f"agent-{i}"]["assignment_epoch"] == repaired for i in survivors
        ),
        30, "every survivor to hold the repaired graph",
    )  # fmt: skip

    # Training goes on: rounds advance, and nobody pushes to the dead any more.
    settled = {i: fleet.round_of(i) + 2 for i in survivors}
    fleet.wait(lambda: all(fleet.round_of(i) >= settled[i] for i in survivors), 120, "rounds")
    failed = failed_sends(fleet, survivors)
    received = {i: fleet.latest(i).counters.messages_received for i in survivors}  # type: ignore[union-attr]
    accuracy_before = fleet.accuracy(survivors)
    start = {i: fleet.round_of(i) for i in survivors}
    fleet.wait(lambda: all(fleet.round_of(i) >= start[i] + 10 for i in survivors), 180, "rounds")
    assert failed_sends(fleet, survivors) == failed, "survivors still push to dead agents"
    assert all(fleet.latest(i).counters.messages_received > received[i] for i in survivors)  # type: ignore[union-attr]
    accuracy_after = fleet.accuracy(survivors)
    print(f"survivors' mean accuracy {accuracy_before:.3f} -> {accuracy_after:.3f}")
    assert accuracy_after >= accuracy_before - 0.05
    assert fleet.fleet()["epoch"] == repaired

    # The dead come back under their ids and are wired in again.
    for i in victims:
        fleet.start_agent(i)
    members = fleet.wait(
        lambda: (m := fleet.members())
        and all(m[f"agent-{i}"]["state"] == "alive" for i in victims)
        and m,
        240, "the restarted agents to rejoin",
    )  # fmt: skip
    assert all(members[f"agent-{i}"]["incarnation"] == 2 for i in victims)
    view = fleet.fleet()
    everybody = {f"agent-{i}" for i in everyone}
    assert strongly_connected(view["edges"][0], everybody)
    # Without checkpoints they rejoin at the fleet's round, with a small weight: within a
    # few rounds they hold what the fleet learned (docs/algorithms.md, "Restarts").
    fleet.wait(lambda: all(len(fleet.records(i)) >= 10 for i in victims), 180, "rejoined rounds")
    accuracy_fleet = fleet.accuracy(survivors)
    for i in victims:
        records = fleet.records(i)
        assert records[-1].counters.messages_received > 0
        print(f"agent-{i} rejoined at round {records[0].round}: accuracy "
              f"{records[-1].metrics['accuracy']:.3f} at round {records[-1].round}, the "
              f"survivors' {accuracy_fleet:.3f}")  # fmt: skip
        assert records[0].round > 6  # not from round 0: the fleet was past round 6
        assert records[-1].metrics["accuracy"] >= accuracy_fleet - 0.05
    assert fleet.fleet()["counters"]["failures"] == 2


@pytest.mark.timeout(600)
def test_coordinator_killed_mid_run_then_restarted_on_its_database(
    fleets: list[LocalFleet], tmp_path: Path
) -> None:
    fleet = LocalFleet(tmp_path, agents=4, topology=["--topology", "exponential"])
    fleets.append(fleet)
    fleet.start_coordinator()
    agents = list(range(4))
    for i in agents:
        fleet.start_agent(i)
    fleet.wait(lambda: all(fleet.round_of(i) >= 6 for i in agents), 300, "all 4 to train")
    fleet.wait(lambda: all(m["assignment_epoch"] == 1 for m in fleet.members().values()), 30,
               "heartbeats from every agent")  # fmt: skip
    before = fleet.fleet()
    pids = {i: fleet.agents[i].pid for i in agents}

    fleet.kill_coordinator()
    rounds = {i: fleet.round_of(i) for i in agents}
    accuracy_before = fleet.accuracy(agents)
    # Agents keep training without it: rounds advance, accuracy does not regress.
    fleet.wait(lambda: all(fleet.round_of(i) >= rounds[i] + 10 for i in agents), 180, "rounds")
    accuracy_after = fleet.accuracy(agents)
    print(f"without a coordinator: mean accuracy {accuracy_before:.3f} -> {accuracy_after:.3f}, "
          f"rounds {rounds} -> { {i: fleet.round_of(i) for i in agents} }")  # fmt: skip
    assert accuracy_after >= accuracy_before - 0.02
    for i in agents:
        assert fleet.agents[i].poll() is None
        assert "gossiping on with cached neighbours" in fleet.log_tail(f"agent-{i}.log", 200)

    # Restarted on the same database, its registry is intact...
    fleet.start_coordinator()
    after = fleet.fleet()
    assert after["restored"] is True
    keys = ("agent_id", "state", "address", "metrics_address", "joined_at", "incarnation")
    assert [{k: m[k] for k in keys} for m in after["members"]] == [
        {k: m[k] for k in keys} for m in before["members"]
    ]
    assert (after["epoch"], after["edges"]) == (before["epoch"], before["edges"])

    # ...and the agents, never restarted, reconnect and report again.
    fleet.wait(
        lambda: (v := fleet.fleet())["counters"]["heartbeats"] >= 4 * len(agents)
        and all(m["heartbeat_age_s"] < 2 for m in v["members"]),
        60, "heartbeats from every agent to the new coordinator",
    )  # fmt: skip
    for i in agents:
        assert fleet.agents[i].pid == pids[i] and fleet.agents[i].poll() is None
        assert "is back" in fleet.log_tail(f"agent-{i}.log", 200)
    final = fleet.fleet()
    assert final["counters"]["failures"] == 0 and final["epoch"] == before["epoch"]
    assert all(m["state"] == "alive" and m["incarnation"] == 1 for m in final["members"])
