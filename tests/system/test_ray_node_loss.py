"""``--mode ray`` losing a node mid-run (a real Ray cluster of three nodes on loopback): Ray
restarts its host actor on another node, whose agents resume from their checkpoints, rejoin
at the fleet's round and the fleet ends as accurate as ever; on a full cluster (no room for them)
the fleet goes on without them and ends with what the survivors did."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airgossip.emulation.fleets import Fleet, FleetProgress, run_fleet
from airgossip.scenario.config import load_config
from tests.system.ray_support import host_actors, leftovers, ray_cluster

pytestmark = pytest.mark.slow


def test_agents_of_a_removed_node_restart_elsewhere_from_their_checkpoints(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with ray_cluster(monkeypatch, nodes=3) as cluster:
        victim = cluster.list_all_nodes()[-1]
        removed = threading.Event()
        #: Ray's records of the host actors once all run again, one restarted.
        after: list[list[dict[str, Any]]] = []

        def remove_at_round(progress: FleetProgress) -> None:
            # Once every agent trained a few rounds (and checkpointed), the node goes.
            if not removed.is_set() and progress.slowest_round >= 8:
                removed.set()
                cluster.remove_node(victim, allow_graceful=False)
            elif removed.is_set() and not after:
                actors = host_actors()
                if all(a["State"] == "ALIVE" for a in actors) and any(
                    a["NumRestarts"] for a in actors
                ):
                    after.append(actors)

        ray = {"address": cluster.address, "placement": "spread", "checkpoint_interval_s": 0.5}
        config = load_config(None, {"mode": "ray", "agents": 6, "rounds": 250, "ray": ray})
        fleets: list[Fleet] = []
        run_fleet(config, out, on_progress=remove_at_round, on_start=fleets.append)
        assert removed.is_set() and after, "the removed node's agents never ran again"
        actors = after[0]
        survivors = {n.node_id for n in cluster.list_all_nodes()}
    assert victim.node_id not in survivors
    restarted = [a for a in actors if a["NumRestarts"] > 0]
    # Ray restarted the host of the removed node (its two agents), on one of the other two.
    assert len(restarted) == 1, [(a["Address"]["NodeID"], a["NumRestarts"]) for a in actors]
    assert all(a["Address"]["NodeID"] in survivors for a in restarted)
    report = json.loads((out / "ray.json").read_text())["agents"]
    moved = {i: s for i, s in report.items() if s[0]["node_id"] == victim.node_id}
    assert len(moved) == 2, report
    for agent_id, states in moved.items():
        # Its next incarnation took its checkpoint back from the store and rejoined late.
        last = states[-1]
        assert last["restarted"] and last["node_id"] in survivors, states
        assert last["resumed_from"] and last["resumed_from"].startswith(agent_id), states
        log = (out / "logs" / f"{agent_id}.log").read_text()
        assert "restarted by Ray" in log, log[-2000:]
        resumed = re.search(r"resumed round (\d+)", log)
        assert resumed, log[-2000:]
        # ...and trained on with the fleet from there (at the fleet's round, had the fleet
        # gone on without it meanwhile) to the end.
        rounds = [r.round for r in fleets[0].records()[agent_id]]
        after = [r for r in rounds if r > int(resumed.group(1))]
        print(f"{agent_id}: resumed round {resumed.group(1)}, {len(after)} rounds after it")
        assert len(after) >= 5 and rounds[-1] == 250, rounds
    final = json.loads((out / "results.json").read_text())["final"]
    print(f"after losing a node: mean accuracy {final['mean_accuracy']:.4f}, moved {list(moved)}")
    assert final["agents_reporting"] == 6
    assert final["mean_accuracy"] >= 0.9


@pytest.mark.timeout(420)
def test_a_full_cluster_that_loses_a_node_ends_with_what_its_survivors_did(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # 3 nodes x 2 CPUs and 12 agents at 0.5 CPU: no room anywhere for the lost node's four.
    out = tmp_path / "run"
    homes = Path(tempfile.mkdtemp(prefix="ag-", dir="/tmp"))
    try:
        with ray_cluster(monkeypatch, nodes=3, cpus=2, homes=homes) as cluster:
            victim = cluster.list_all_nodes()[-1]
            started = time.monotonic()
            removed: list[float] = []

            # Removed once the whole fleet is under way (every agent past round 30: on a
            # quiet machine about 45 s in), wherever the machine's speed puts that in time.
            def remove_under_way(progress: FleetProgress) -> None:
                if not removed and progress.slowest_round >= 30:
                    removed.append(time.monotonic() - started)
                    cluster.remove_node(victim, allow_graceful=False)

            ray = {"address": cluster.address, "num_cpus": 0.5, "checkpoint_interval_s": 1.0}
            config = load_config(None, {"mode": "ray", "agents": 12, "rounds": 120, "ray": ray})
            run_fleet(config, out, on_progress=remove_under_way)
            took = time.monotonic() - started
        assert removed, "the run ended before the node was removed"
        report = json.loads((out / "ray.json").read_text())
        # The four agents of the removed node were never placed again: counted out.
        assert len(report["left_out"]) == 4, report["left_out"]
        assert all(report["agents"][i][0]["node_id"] == victim.node_id for i in report["left_out"])
        final = json.loads((out / "results.json").read_text())["final"]
        print(
            f"full cluster, node removed at {removed[0]:.0f} s: run {took:.0f} s, "
            f"{final['agents_reporting']} reporting, mean accuracy {final['mean_accuracy']:.4f}"
        )
        assert not final["complete"]  # a partial run, and marked so
        assert final["agents_reporting"] >= 8
        assert final["mean_accuracy"] >= 0.9
        # No agent's key is left behind, not even those of the killed node's actors.
        deadline = time.monotonic() + 15
        while leftovers(homes) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not leftovers(homes)
    finally:
        shutil.rmtree(homes, ignore_errors=True)
