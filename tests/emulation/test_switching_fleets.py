"""A [switching] schedule through the fleet and network layers: inproc, virtual and process
run it (push-sum stays exact across switches), namespaces refuses it, bad combinations stop
at start; and what dense-then-sparse, and the reverse, cost and buy
on class-skewed digits (Xie et al., arXiv 2509.12213)."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from airgossip.emulation.fleets import Fleet, preflight, run_fleet
from airgossip.emulation.fleets.inproc import InProcessFleet
from airgossip.emulation.fleets.virtual import VirtualFleet
from airgossip.emulation.networks import network_for
from airgossip.scenario.config import ConfigError, load_config, read_scenario
from airgossip.scenario.results import summarise
from airgossip.scenario.wireless import scenario_path
from tests.support.inproc import inproc_fleet

SCHEDULE = {"topologies": ["complete", "ring", "one-peer-exponential", "exponential"],
            "at_rounds": [4, 8, 12]}  # fmt: skip


def consensus(**overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "mode": "inproc", "task": {"name": "consensus", "dim": 30}, "agents": 16,
        "rounds": 300, "eval_every": 50, "network": {"loss": 0.1}, "switching": SCHEDULE,
    }  # fmt: skip
    return {**settings, **overrides}


def epochs(fleets: list[Fleet]) -> set[int]:
    """The assignment epochs held by the agents of the one fleet ``run_fleet`` started."""
    (fleet,) = fleets
    assert isinstance(fleet, InProcessFleet)
    return {a.assignment.epoch for a in fleet.agents if a.assignment is not None}


def test_inproc_switches_by_round_and_push_sum_stays_exact(tmp_path: Path) -> None:
    config = load_config(None, consensus())
    assert config.topology == "complete"  # the schedule's first graph
    fleets: list[Fleet] = []
    results = run_fleet(config, tmp_path, on_start=fleets.append).to_json()
    assert results["config"]["switched_at"] == [4, 8, 12]
    assert epochs(fleets) == {4}  # every switch reached every agent
    assert results["final"]["relative_error"] < 1e-10
    assert results["final"]["messages_dropped"] > 0.05 * results["final"]["messages_sent"]


def test_inproc_switches_when_the_consensus_distance_falls(tmp_path: Path) -> None:
    adaptive = {"topologies": ["directed-ring", "complete", "exponential"],
                "trigger": "consensus-distance-below", "threshold": 0.2, "window": 1}  # fmt: skip
    config = load_config(None, consensus(switching=adaptive, eval_every=1))
    fleets: list[Fleet] = []
    results = run_fleet(config, tmp_path, on_start=fleets.append)
    switched = results.config["switched_at"]
    assert len(switched) == 2 and switched[0] > 2
    assert epochs(fleets) == {3}
    assert results.final.relative_error is not None and results.final.relative_error < 1e-10
    assert results.final.messages_dropped > 0.05 * results.final.messages_sent


def test_the_virtual_fleet_switches_when_its_slowest_agent_finishes_the_round(
    tmp_path: Path,
) -> None:
    config = load_config(None, consensus(mode="virtual", rounds=200))
    results = run_fleet(config, tmp_path)
    assert results.config["switched_at"] == [4, 8, 12]
    assert results.final.complete
    assert results.final.relative_error is not None and results.final.relative_error < 1e-10


def test_the_virtual_fleet_installs_every_switch_on_every_agent() -> None:
    config = load_config(None, consensus(mode="virtual", rounds=30))
    fleet = VirtualFleet(config, network_for(config))
    fleet.run()
    assert {a.assignment.epoch for a in fleet.agents if a.assignment} == {4}
    assert len(fleet.agents[0].assignment.peers) == 15  # type: ignore[union-attr]
    assert fleet.links.switched_at == [4, 8, 12]  # type: ignore[attr-defined]


class FleetWatcher:
    """Polls the embedded coordinator's ``/fleet`` while a process fleet runs: the highest
    assignment epoch each agent has said (in a heartbeat) that it holds."""

    def __init__(self) -> None:
        self.epochs: dict[str, int] = {}
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_notice(self, text: str) -> None:
        found = re.search(r"http://(\S+)/metrics", text)
        if found and self._thread is None:
            url = f"http://{found.group(1)}/fleet"
            self._thread = threading.Thread(target=self._poll, args=(url,), daemon=True)
            self._thread.start()

    def _poll(self, url: str) -> None:
        while not self.stop.wait(0.2):
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    view = json.load(reply)
            except OSError:
                continue  # not serving yet, or already stopped
            for member in view["members"]:
                agent_id, epoch = member["agent_id"], member["assignment_epoch"]
                self.epochs[agent_id] = max(epoch, self.epochs.get(agent_id, 0))


@pytest.mark.slow
def test_process_mode_switches_through_its_coordinator_and_push_sum_stays_exact(
    tmp_path: Path,
) -> None:
    # Real agent processes over real gRPC (mutual TLS): the coordinator decides the switch
    # from their round reports, which arrive with their heartbeats (every 2 s), so the
    # rounds are slowed (50 ms a message) for the agents to run on well past the switch.
    schedule = {"topologies": ["complete", "ring"], "at_rounds": [6]}
    settings = consensus(mode="process", agents=6, rounds=80, eval_every=1,
                         network={"loss": 0.1, "latency_ms": 50}, switching=schedule)  # fmt: skip
    config = load_config(None, settings)
    watcher = FleetWatcher()
    try:
        results = run_fleet(
            config, tmp_path / "run", on_notice=watcher.on_notice,
            coordinator_metrics_listen="127.0.0.1:0",
        )  # fmt: skip
    finally:
        watcher.stop.set()
    assert results.config["switched_at"] == [6]  # the round the coordinator switched at
    assert results.final.complete and results.final.agents_reporting == 6
    assert results.final.relative_error is not None and results.final.relative_error < 1e-6
    assert results.final.messages_dropped > 0.05 * results.final.messages_sent
    # Every agent installed the ring's epoch (it reached each a little after round 6).
    assert watcher.epochs == {f"agent-{i}": 2 for i in range(6)}


def test_the_namespaces_mode_refuses_a_schedule_and_process_mode_takes_it() -> None:
    # Namespaced agents run on a static peer list, without a coordinator to switch them.
    # (The containers mode switches through its coordinator: tests/deploy.)
    config = load_config(None, consensus(mode="namespaces", agents=4))
    with pytest.raises(ConfigError, match="mode 'namespaces' cannot switch the gossip graph"):
        preflight(config)
    plan = preflight(load_config(None, consensus(mode="process", agents=4)))
    assert plan.network.round_driven


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"topology": "ring"}, "the run starts on the first topology of \\[switching\\]"),
        ({"switching": {"topologies": ["complete", "ring"]}}, "switching: give at_rounds"),
    ],
)
def test_bad_combinations_stop_at_load(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, consensus(**overrides))


def test_a_wireless_network_keeps_its_own_graph() -> None:
    base = read_scenario(scenario_path("wifi-indoor"))
    with pytest.raises(ConfigError, match="\\[switching\\] needs \\[network\\] links"):
        load_config(None, consensus(mode="virtual"), base=base)


def test_every_graph_of_a_schedule_must_serve_the_algorithm() -> None:
    schedule = {"topologies": ["ring", "directed-ring"], "at_rounds": [5]}
    config = load_config(None, consensus(algorithm="dpsgd", switching=schedule))
    with pytest.raises(ConfigError, match="needs undirected graphs; \\[switching\\] goes "
                                          "through directed-ring"):  # fmt: skip
        preflight(config)
    network = network_for(load_config(None, consensus()))
    assert network.describe() == "complete → ring → one-peer-exponential → exponential · loss 0.1"
    assert network.round_driven


# -- dense-then-sparse and the reverse on class-skewed digits ----------------------------------
SKEWED: dict[str, Any] = {"name": "digits", "partition": "dirichlet", "alpha": 0.1}


@lru_cache(maxsize=8)
def learn(topologies: tuple[str, ...], **schedule: Any) -> tuple[float, int]:
    """Class-skewed digits, 16 agents, 80 rounds, 10% loss, push-sum, on one graph or a
    schedule through ``topologies``; (mean accuracy, bytes sent)."""
    settings: dict[str, Any] = {
        "agents": 16, "rounds": 80, "eval_every": 1, "task": SKEWED, "network": {"loss": 0.1},
    }  # fmt: skip
    if len(topologies) == 1:
        settings["topology"] = topologies[0]
    else:
        settings["switching"] = {"topologies": list(topologies), **schedule}
    final = summarise(inproc_fleet(**settings).records()).final
    assert final.mean_accuracy is not None
    return final.mean_accuracy, final.bytes_sent


def test_dense_then_exponential_reaches_the_dense_accuracy_with_at_most_60_percent_bytes() -> None:
    dense, dense_bytes = learn(("complete",))
    accuracy, sent = learn(("complete", "exponential"), at_rounds=(33,))
    assert accuracy >= dense - 0.01
    assert sent <= 0.6 * dense_bytes


@pytest.mark.xfail(
    strict=True,
    reason="with the ring as the sparse graph, dense-then-sparse loses 0.023: complete for 32 "
    "rounds, then the ring, ends at 0.9298 against complete's 0.9526 (48% of the bytes)",
)
def test_dense_then_ring_reaches_the_dense_accuracy_with_at_most_60_percent_bytes() -> None:
    dense, dense_bytes = learn(("complete",))
    accuracy, sent = learn(("complete", "ring"), at_rounds=(33,))
    assert sent <= 0.6 * dense_bytes
    assert accuracy >= dense - 0.01


def test_sparse_then_dense_on_a_loss_plateau_reaches_the_dense_accuracy_cheaply() -> None:
    dense, dense_bytes = learn(("complete",))
    accuracy, sent = learn(
        ("ring", "complete"), trigger="loss-plateau", threshold=0.05, window=5, min_rounds=20
    )
    assert accuracy >= dense - 0.01
    assert sent <= 0.6 * dense_bytes
