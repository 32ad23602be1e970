"""``[[device_classes]]``: agents sorted into classes by the run's seed, checked with clear
errors, and emulated on the virtual clock (each agent's local step takes ``compute_s`` over its
class's speed, on the fast path and with the agents themselves alike)."""

from __future__ import annotations

from typing import Any

import pytest
import tomllib

from airgossip.emulation.fleets.virtual import VirtualFleet
from airgossip.emulation.networks import network_for
from airgossip.scenario.config import (
    ConfigError,
    RunConfig,
    load_config,
    read_scenario,
    scenario_toml,
)
from airgossip.scenario.devices import HOST
from airgossip.scenario.wireless import scenario_path

PI = {"name": "pi", "fraction": 0.2, "speed": 0.2, "compute_w": 4.0}
PHONE = {"name": "phone", "agents": [0, 3], "speed": 0.5}


def config(agents: int = 10, classes: list[dict[str, Any]] | None = None, **more: Any) -> RunConfig:
    return load_config(None, {"agents": agents, "device_classes": classes or [], **more})


def test_listed_agents_then_fractions_by_the_seed_the_rest_host() -> None:
    run = config(10, [PI, PHONE], seed=4)
    assigned = [d.name for d in run.device_assignment()]
    assert assigned[0] == assigned[3] == "phone"
    assert assigned.count("pi") == 2 and assigned.count("host") == 6
    assert [run.device_class(i).name for i in range(10)] == assigned
    # a pure function of the scenario: every process that asks gets the same
    assert [d.name for d in config(10, [PI, PHONE], seed=4).device_assignment()] == assigned
    others = {tuple(d.name for d in config(10, [PI, PHONE], seed=s).device_assignment())
              for s in range(8)}  # fmt: skip
    assert len(others) > 1  # the seed draws them
    assert config(10).device_class(5) is HOST
    assert run.device_class(assigned.index("pi")).stretch == pytest.approx(5.0)


def test_a_fraction_takes_the_nearest_whole_number_and_at_least_one() -> None:
    assert [d.name for d in config(3, [PI]).device_assignment()].count("pi") == 1
    assert [d.name for d in config(16, [PI]).device_assignment()].count("pi") == 3


@pytest.mark.parametrize(
    ("classes", "says"),
    [
        ([{"name": "pi", "speed": 0.5}], "give either fraction"),
        ([{"name": "pi", "fraction": 0.5, "agents": [1]}], "give either fraction"),
        ([{"name": "pi", "agents": [10]}], "lists agent 10, outside the fleet of 10 agents"),
        ([{"name": "pi", "agents": [1, 1]}], "lists an agent twice"),
        ([{"name": "pi", "agents": [1]}, {"name": "jet", "agents": [1]}], "agent 1 is in two"),
        ([PI, {**PI}], "device class 'pi' is declared twice"),
        ([{"name": "host", "fraction": 0.5}], "the class of agents no entry takes"),
        ([{**PI, "fraction": 0.7}, {**PHONE, "name": "b", "agents": None, "fraction": 0.4}],
         "device classes take more agents than the fleet has"),
        ([{**PI, "speed": 0}], "speed"),
        ([{**PI, "name": "a b"}], "name"),
        ([{**PI, "watts": 3}], "watts"),
    ],
)  # fmt: skip
def test_bad_classes_are_refused_saying_what_is_wrong(
    classes: list[dict[str, Any]], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        config(10, classes)


def test_the_classes_survive_the_run_folder_s_scenario() -> None:
    run = config(10, [PI, PHONE], seed=2)
    again = load_config(None, {}, base=tomllib.loads(scenario_toml(run)))
    assert again.device_classes == run.device_classes
    assert again.device_assignment() == run.device_assignment()
    assert RunConfig.model_validate_json(run.model_dump_json()) == run


def virtual(fast: bool, classes: list[dict[str, Any]]) -> VirtualFleet:
    base: dict[str, Any] = read_scenario(scenario_path("lte-urban"))
    base["wireless"]["mobility"]["area_m"] = [300.0, 300.0]
    values = {"mode": "virtual", "agents": 6, "rounds": 12, "seed": 3,
              "task": {"name": "consensus"}, "device_classes": classes}  # fmt: skip
    run = load_config(None, values, base=base)
    fleet = VirtualFleet(run, network_for(run), fast=fast)
    fleet.run()
    return fleet


@pytest.mark.parametrize("fast", [True, False])
def test_a_slow_class_takes_its_steps_longer_on_the_virtual_clock(fast: bool) -> None:
    slow = [{"name": "pi", "agents": [2], "speed": 0.25}]
    fleet = virtual(fast, slow)
    compute_s = fleet.network.compute_s
    assert compute_s > 0
    assert fleet.step_s == [compute_s] * 2 + [4 * compute_s] + [compute_s] * 3
    records = fleet.records()
    finished = {agent_id: rs[-1].wall_s for agent_id, rs in records.items()}
    # 12 local steps of 4 x compute_s at least; its in-neighbours wait for it (staleness)
    assert finished["agent-2"] >= 12 * 4 * compute_s
    even = virtual(fast, [])
    assert max(r[-1].wall_s for r in even.records().values()) < 12 * 4 * compute_s
