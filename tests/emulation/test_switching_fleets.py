"""A [switching] schedule through the fleet and network layers: inproc and virtual run it
(push-sum stays exact across switches), modes whose agents run in their own processes refuse
it, bad combinations stop at start; and what dense-then-sparse, and the reverse, cost and buy
on class-skewed digits (Xie et al., arXiv 2509.12213)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from emulation.config import ConfigError, load_config, read_scenario
from emulation.fleets import Fleet, preflight, run_fleet
from emulation.fleets.inproc import InProcessFleet
from emulation.fleets.virtual import VirtualFleet
from emulation.networks import network_for
from emulation.results import summarise
from emulation.scenario import scenario_path
from tests.support import inproc_fleet

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


@pytest.mark.parametrize("mode", ["process", "namespaces", "containers"])
def test_modes_with_agent_processes_refuse_a_schedule(mode: str) -> None:
    config = load_config(None, consensus(mode=mode, agents=4))
    with pytest.raises(ConfigError, match=f"mode '{mode}' cannot switch the gossip graph"):
        preflight(config)


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
