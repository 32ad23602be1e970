"""``--mode ray`` with 64 agents on a real Ray cluster of three nodes x 2 CPUs on loopback:
one host actor per node forks its 21 or 22 agents from one import of torch, the fleet
learns, and one agent's process killed mid-run is forked again by its host from its own
checkpoint while its process-mates train on untouched."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from pydantic import JsonValue

from airgossip.emulation.fleets import run_fleet
from airgossip.emulation.fleets.ray_cluster import RayCluster
from airgossip.scenario.config import ConfigError, load_config
from airgossip.scenario.modes.ray import RaySettings
from tests.system.ray_support import leftovers, ray_cluster

AGENTS = 64
VICTIM = "agent-7"


def agent_pid(homes: Path, agent_id: str) -> int | None:
    """The pid of ``agent_id``'s process forked by a host whose folder is in ``homes`` (the
    fork server names each child after its agent). ``pgrep`` reads /proc: a scan from this
    process, whose interpreter the driver's many threads share, takes tens of seconds on
    two loaded cores."""
    found = subprocess.run(["pgrep", "-x", agent_id], capture_output=True, text=True)
    for pid in found.stdout.split():
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(homes)):
                return int(pid)
        except OSError:
            continue
    return None


@pytest.mark.parametrize("value", [0, -3, 1.5, "many"])
def test_a_bad_agents_per_host_is_refused_in_one_line(value: JsonValue) -> None:
    with pytest.raises(ConfigError, match=r"^bad settings: ray\.agents_per_host: [^\n]+$"):
        load_config(None, {"mode": "ray", "ray": {"agents_per_host": value}})


@pytest.mark.parametrize(
    ("agents", "per_host", "sizes"),
    [(64, 30, [22, 21, 21]), (64, 64, [64]), (5, 2, [2, 2, 1]), (3, 1, [1, 1, 1])],
)
def test_hosts_split_the_fleet_as_evenly_as_whole_agents_go(
    agents: int, per_host: int, sizes: list[int]
) -> None:
    config = load_config(None, {"mode": "ray", "ray": {"agents_per_host": per_host}})
    cluster = RayCluster(config.mode_settings(RaySettings), agents, notice=print)
    assert cluster.host_sizes() == sizes
    # A host reserves what its agents would: 0.05 CPU each, rounded as Ray rounds.
    assert RayCluster(
        load_config(None, {"ray": {"num_cpus": 0.05}}).mode_settings(RaySettings), 22, print
    ).bundle(22) == {"CPU": 1.1}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sixty_four_agents_on_three_small_nodes_learn_and_survive_a_killed_agent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    homes = Path(tempfile.mkdtemp(prefix="ag-", dir="/tmp"))
    killed: list[float] = []
    newest: list[str] = []  # the victim's newest checkpoint when it was killed
    try:
        with ray_cluster(monkeypatch, nodes=3, cpus=2, homes=homes, system_config={}):

            def kill_one() -> None:
                # Mid-run: once the victim wrote a checkpoint (its first, 2 s into training).
                # A thread of its own, not the fleet's progress callback: the driver's
                # monitor hears from three busy host actors, and on two cores its updates can
                # come after the victim has finished.
                while not done.wait(0.2):
                    saved = sorted(homes.glob(f"airgossip-host-*/{VICTIM}/checkpoints/*.ckpt"))
                    pid = agent_pid(homes, VICTIM) if saved else None
                    if pid is not None:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(time.time())
                        newest.append(saved[-1].name)
                        return

            ray = {"num_cpus": 0.05, "checkpoint_interval_s": 2.0}
            config = load_config(None, {"mode": "ray", "agents": AGENTS, "rounds": 30, "ray": ray})
            done = threading.Event()
            killer = threading.Thread(target=kill_one, name="kill-one", daemon=True)
            started = time.monotonic()
            killer.start()
            try:
                run_fleet(config, out)
            finally:
                done.set()
                killer.join()
            took = time.monotonic() - started
        assert killed, f"{VICTIM}'s process was never found"
        report = json.loads((out / "ray.json").read_text())
        # One host per node, the agents split evenly, each agent on its host's node.
        assert sorted(len(a) for a in report["hosts"].values()) == [21, 21, 22]
        nodes = Counter(states[0]["node_id"] for states in report["agents"].values())
        assert sorted(nodes.values()) == [21, 21, 22], nodes
        # The killed agent was forked again on its node from its own checkpoint; no other
        # agent started again (its host, and its process-mates, went on).
        again = {i: s for i, s in report["agents"].items() if any(x["restarted"] for x in s)}
        assert list(again) == [VICTIM], again
        assert again[VICTIM][-1]["node_id"] == again[VICTIM][0]["node_id"]
        log = (out / "logs" / f"{VICTIM}.log").read_text()
        assert "killed by SIGKILL" in log and "forks it again" in log, log[-3000:]
        resumed = re.search(r"resumed round (\d+)", log)
        assert resumed and int(resumed.group(1)) < 30, log[-3000:]  # killed mid-run
        # Forked again and serving (measured from the kill, from its new process's log).
        served = re.findall(r"^(\S+ \S+) INFO airgossip.agent: \S+ serving on", log, re.M)
        back = datetime.strptime(served[-1], "%Y-%m-%d %H:%M:%S,%f").timestamp() - killed[0]
        print(
            f"{VICTIM} killed after writing {newest[0]}, resumed round {resumed.group(1)}: "
            f"serving again {back:.1f} s after the kill"
        )
        assert len(served) == 2 and 0 < back < 60, served
        final = json.loads((out / "results.json").read_text())["final"]
        print(
            f"{AGENTS} agents on 3 Ray nodes x 2 CPUs: run {took:.0f} s, "
            f"mean accuracy {final['mean_accuracy']:.4f}, {final['agents_reporting']} reporting"
        )
        # Every agent's last round reported (the killed one's from its second process). Its
        # agents' sessions yield to the driver as Ray's worker niceness means them to (each
        # forked agent is a session of its own, which the kernel's autogroups would otherwise
        # weigh as much as the whole driver): before, 64 of them starved its coordinator of
        # heartbeats for tens of seconds and it declared the fleet dead at once.
        assert final["complete"] and final["agents_reporting"] == AGENTS
        assert final["mean_accuracy"] >= 0.9
        assert report["left_out"] == []
        deadline = time.monotonic() + 15
        while leftovers(homes) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not leftovers(homes), leftovers(homes)
    finally:
        shutil.rmtree(homes, ignore_errors=True)
