"""``[[device_classes]]``: agents sorted into classes by the run's seed, checked with clear
errors, and emulated on the virtual clock (each agent's local step takes ``compute_s`` over its
class's speed, on the fast path and with the agents themselves alike); the energy ledger of
each agent (compute time and airtime at its class's power), and an agent whose battery is
spent leaving the fleet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomllib
from prometheus_client import generate_latest

from airgossip.edge.availability import OnlineSchedule
from airgossip.edge.energy import EnergyLedger, PowerModel
from airgossip.edge.observability.metrics import AgentMetrics
from airgossip.edge.observability.stats import RoundRecord
from airgossip.edge.tasks.consensus import ConsensusOptions, true_average
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
from airgossip.scenario.results import (
    RunResults,
    over_time,
    plot_results,
    summarise,
    time_to_accuracy,
)
from airgossip.scenario.wireless import scenario_path
from tests.support.prometheus import promtool_check

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


def virtual(fast: bool | None, classes: list[dict[str, Any]], **more: Any) -> VirtualFleet:
    base: dict[str, Any] = read_scenario(scenario_path("lte-urban"))
    base["wireless"]["mobility"]["area_m"] = [300.0, 300.0]
    values = {"mode": "virtual", "agents": 6, "rounds": 12, "seed": 3,
              "task": {"name": "consensus"}, "device_classes": classes, **more}  # fmt: skip
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


def test_the_ledger_charges_compute_time_and_airtime_at_the_link_s_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rates = {("a", "b"): 1e6, ("b", "a"): 2e6}
    ledger = EnergyLedger(
        "a", PowerModel(compute_w=4.0, tx_w=2.0, rx_w=1.0, battery_j=10.0),
        lambda s, r: rates.get((s, r)),
    )  # fmt: skip
    ledger.computed(0.5)
    ledger.sent("b", 125_000)  # 1 Mbit at 1 Mb/s: 1 s on the air
    ledger.received("b", 250_000)  # 2 Mbit at 2 Mb/s
    assert ledger.figures() == pytest.approx(
        {"energy_j": 5.0, "compute_j": 2.0, "radio_j": 3.0, "battery_left_j": 5.0}
    )
    assert ledger.radio_known and not ledger.depleted
    ledger.sent("c", 125_000)  # no rate known for a->c, and no nominal one
    assert not ledger.radio_known and ledger.total_j == pytest.approx(5.0)
    ledger.sent("d", 125_000)  # said once, in the agent's log
    said = [r.getMessage() for r in caplog.records if "no rate is known" in r.getMessage()]
    assert said == ["a: no rate is known for the link a -> c, and its device class gives no "
                    "radio_mbps: its messages cost no radio energy"]  # fmt: skip
    ledger.computed(2.0)
    assert ledger.depleted and ledger.battery_left_j == 0.0
    nominal = EnergyLedger("a", PowerModel(tx_w=1.0, radio_bps=8e6))
    nominal.sent("b", 1_000_000)
    assert nominal.figures() == pytest.approx({"energy_j": 1.0, "compute_j": 0.0, "radio_j": 1.0})


@pytest.mark.parametrize(
    "bad", [{"compute_w": -1.0}, {"tx_w": float("nan")}, {"battery_j": 0.0}, {"radio_bps": -5.0}]
)
def test_a_power_model_refuses_what_no_device_draws(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        PowerModel(**bad)


def test_classes_without_power_account_nothing() -> None:
    assert config(10, [PHONE]).device_class(0).power_model() is None
    power = config(10, [{**PHONE, "radio_mbps": 5.0, "rx_w": 0.5}]).device_class(0).power_model()
    assert power == PowerModel(rx_w=0.5, radio_bps=5e6)


def test_the_virtual_clock_accounts_each_agent_s_energy_and_a_spent_battery_leaves() -> None:
    watts = {"compute_w": 3.0, "tx_w": 1.5, "rx_w": 0.5}
    classes = [
        {"name": "pi", "agents": [2], "speed": 0.25, **watts},
        {"name": "phone", "agents": [4], **watts, "battery_j": 1.0},
        {"name": "box", "agents": [0, 1, 3, 5], **watts},
    ]
    fleet = virtual(None, classes)
    assert not fleet.fast  # the agents keep the ledger
    compute_s = fleet.network.compute_s
    records = fleet.records()
    last = {agent_id: rs[-1] for agent_id, rs in records.items()}
    box = last["agent-0"]
    assert box.round == 12
    assert box.metrics["compute_j"] == pytest.approx(3.0 * 12 * compute_s)
    assert box.metrics["radio_j"] > 0  # airtime at the channel model's rates
    assert box.metrics["energy_j"] == pytest.approx(
        box.metrics["compute_j"] + box.metrics["radio_j"]
    )
    assert "battery_left_j" not in box.metrics
    # the slow class computes four times as long at the same power
    assert last["agent-2"].metrics["compute_j"] == pytest.approx(4 * box.metrics["compute_j"])
    # the phone's battery ran out: it left with a final record, the others finished
    phone = last["agent-4"]
    assert phone.final and phone.round < 12 and phone.metrics["battery_left_j"] == 0.0
    assert phone.metrics["energy_j"] >= 1.0
    assert all(r.round == 12 for a, r in last.items() if a != "agent-4")


def test_results_carry_the_fleet_s_energy_and_leave_a_spent_agent_out_of_the_final() -> None:
    watts = {"compute_w": 3.0, "tx_w": 1.5, "rx_w": 0.5}
    fleet = virtual(None, [{"name": "phone", "agents": [4], **watts, "battery_j": 1.0},
                           {"name": "box", "agents": [0, 1, 2, 3, 5], **watts}])  # fmt: skip
    results = summarise(fleet.records())
    final, rounds = results.final, results.rounds
    assert final.agents_depleted == 1 and final.agents_reporting == 5
    assert final.mean_energy_j is not None and final.max_energy_j is not None
    assert rounds[0].mean_energy_j == 0.0  # round 0: nothing spent yet
    spent = [r.mean_energy_j or 0.0 for r in rounds]
    assert spent == sorted(spent) and spent[-1] > 0
    assert "mean_energy_j" in results.to_json()["final"]  # type: ignore[operator]
    plain = summarise(virtual(None, []).records())
    assert plain.final.mean_energy_j is None and "mean_energy_j" not in plain.to_json()["final"]  # type: ignore[operator]


def test_an_agent_s_metrics_carry_its_energy_and_battery() -> None:
    metrics = AgentMetrics("agent-4")
    text = generate_latest(metrics.registry).decode()
    assert "airgossip_agent_battery_left_joules" not in text  # none before a battery figure
    assert "airgossip_agent_energy_joules{" not in text
    fleet = virtual(None, [{"name": "phone", "agents": [4], "compute_w": 3.0, "tx_w": 1.5,
                            "battery_j": 1.0}])  # fmt: skip
    last = fleet.records()["agent-4"][-1]
    metrics.record(last)
    get = metrics.registry.get_sample_value
    assert get("airgossip_agent_energy_joules", {"kind": "compute"}) == last.metrics["compute_j"]
    assert get("airgossip_agent_energy_joules", {"kind": "radio"}) == last.metrics["radio_j"]
    assert get("airgossip_agent_battery_left_joules") == 0.0
    promtool_check(generate_latest(metrics.registry).decode())


@pytest.mark.parametrize("kind", ["periodic", "random"])
def test_a_schedule_is_on_its_share_of_the_time_and_the_same_for_its_seed(kind: str) -> None:
    schedule = OnlineSchedule(kind, 30.0, 10.0, seed=4)  # type: ignore[arg-type]
    samples = [schedule.online(t * 1.37) for t in range(146_000)]  # 200,000 s, off-beat
    assert sum(samples) / len(samples) == pytest.approx(0.75, abs=0.02)
    again = OnlineSchedule(kind, 30.0, 10.0, seed=4)  # type: ignore[arg-type]
    times = [t * 0.7 for t in range(2000)]
    assert [schedule.online(t) for t in times] == [again.online(t) for t in times]
    for t in times[::37]:
        back = schedule.next_online(t)
        assert back >= t and schedule.online(back)
        assert back == t or not schedule.online((t + back) / 2)


def test_availability_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="needs on_s and off_s"):
        config(10, [{**PI, "availability": {"kind": "periodic", "on_s": 5}}])
    with pytest.raises(ConfigError, match="takes no on_s"):
        config(10, [{**PI, "availability": {"on_s": 5}}])
    with pytest.raises(ConfigError, match="kind"):
        config(10, [{**PI, "availability": {"kind": "sometimes"}}])
    run = config(10, [{**PHONE, "availability": {"kind": "random", "on_s": 5, "off_s": 5}}])
    assert run.online_schedule(0) is not None and run.online_schedule(1) is None


def test_a_device_that_is_off_holds_its_rounds_and_refuses_messages_on_the_virtual_clock() -> None:
    off = [{"name": "flaky", "agents": [1], "availability": {"kind": "periodic", "on_s": 0.2,
                                                             "off_s": 1.0}}]  # fmt: skip
    fleet = virtual(None, off)
    assert not fleet.fast
    records = fleet.records()
    finished = {agent_id: rs[-1].wall_s for agent_id, rs in records.items()}
    assert all(rs[-1].round == 12 for rs in records.values())
    # on a sixth of the time: its 12 rounds span several off periods
    assert finished["agent-1"] > 3.0 > max(v for a, v in finished.items() if a != "agent-1")
    even = virtual(None, [])
    failed = sum(rs[-1].counters.messages_failed for rs in records.values())
    assert failed > sum(rs[-1].counters.messages_failed for rs in even.records().values())


def consensus_error(fleet: VirtualFleet) -> float:
    run = fleet.config
    reference = true_average(run.seed, run.agents, ConsensusOptions()).numpy()
    error = summarise(fleet.records(), reference=reference).final.relative_error
    assert error is not None
    return error


@pytest.mark.parametrize("fast", [True, False])
def test_asynchronous_agents_go_at_their_own_pace_on_the_virtual_clock(fast: bool) -> None:
    slow = [{"name": "pi", "agents": [2], "speed": 0.2}]
    rounds = virtual(fast, slow, rounds=60)
    own_pace = virtual(fast, slow, rounds=60, pace="async")
    assert own_pace.fast is fast
    held = {a: rs[-1].wall_s for a, rs in rounds.records().items()}
    free = {a: rs[-1].wall_s for a, rs in own_pace.records().items()}
    assert all(rs[-1].round == 60 for rs in own_pace.records().values())
    # in rounds the slow agent holds everyone back; at their own pace the others finish
    # first, in a fraction of the time (it takes five times as long for each step)
    assert max(v for a, v in free.items() if a != "agent-2") < 0.5 * min(held.values())
    assert free["agent-2"] == pytest.approx(held["agent-2"], rel=0.2)
    assert consensus_error(rounds) < 1e-12
    assert consensus_error(own_pace) < 1e-5  # the others stopped before its last mass came


def test_time_to_accuracy_takes_every_agent_s_latest_report() -> None:
    def record(agent: str, round_: int, at: float, accuracy: float, joules: float) -> RoundRecord:
        return RoundRecord(agent, round_, at, {"accuracy": accuracy, "energy_j": joules})

    records = {
        "a": [record("a", 0, 0.0, 0.1, 0.0), record("a", 1, 1.0, 0.9, 2.0),
              record("a", 2, 2.0, 0.95, 4.0)],
        "b": [record("b", 0, 0.0, 0.1, 0.0), record("b", 1, 3.0, 0.875, 9.0)],
    }  # fmt: skip
    moments = over_time(records)
    assert [m.time_s for m in moments] == [0.0, 0.0, 1.0, 2.0, 3.0]
    assert moments[3].mean_accuracy == pytest.approx((0.95 + 0.1) / 2)
    reached = time_to_accuracy(records, 0.9)
    assert reached is not None and reached.time_s == 3.0
    assert reached.mean_accuracy == pytest.approx(0.9125)
    assert reached.mean_energy_j == pytest.approx(6.5)
    assert time_to_accuracy(records, 0.95) is None


def test_the_results_plot_draws_accuracy_against_energy(tmp_path: Path) -> None:
    def width(path: Path) -> int:
        return int.from_bytes(path.read_bytes()[16:20], "big")  # the PNG header's width

    watts = [{"name": "phone", "fraction": 1.0, "compute_w": 3.0, "tx_w": 1.0}]
    for classes, name in (([], "plain.png"), (watts, "energy.png")):
        fleet = virtual(None, classes, rounds=3, task={"name": "digits"})
        plot_results(tmp_path / name, summarise(fleet.records()), name)
    assert width(tmp_path / "energy.png") > 1.3 * width(tmp_path / "plain.png")


def test_results_of_uneven_fleets_carry_the_fleet_over_time() -> None:
    fleet = virtual(None, [{"name": "pi", "agents": [2], "speed": 0.2}], rounds=3,
                    task={"name": "digits"}, pace="async")  # fmt: skip
    results = summarise(fleet.records(), config=fleet.config.model_dump(mode="json"))
    timeline = results.timeline
    assert timeline is not None and 2 <= len(timeline) <= 200
    times = [m.time_s for m in timeline]
    assert times == sorted(times) and timeline[-1].mean_accuracy is not None
    data = RunResults.model_validate_json(json.dumps(results.to_json()))
    assert data.timeline == timeline
    even = virtual(None, [], rounds=3, task={"name": "digits"})
    plain = summarise(even.records(), config=even.config.model_dump(mode="json"))
    assert plain.timeline is None and "timeline" not in plain.to_json()


def test_a_trace_file_of_periods_off_is_read_with_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "off.csv").write_text("agent,off_from_s,off_until_s\n0,0,2.5\n0,10,12\n3,1,2\n")
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        'agents = 6\nmode = "virtual"\n[[device_classes]]\nname = "traced"\nagents = [0, 1]\n'
        'availability = { kind = "trace", file = "off.csv" }\n'  # beside the scenario
    )
    run = load_config(scenario)
    # a scenario's files are beside it, whoever reads it (--config, --scenario, a device)
    both = tmp_path / "both.toml"
    both.write_text(
        '[[device_classes]]\nname = "t"\nagents = [0]\navailability = { file = "off.csv" }\n'
        '[[wireless.traces]]\nfile = "rate.txt"\n'
    )
    read: Any = read_scenario(both)
    assert read["device_classes"][0]["availability"]["file"] == str(tmp_path / "off.csv")
    assert read["wireless"]["traces"][0]["file"] == str(tmp_path / "rate.txt")
    schedule = run.online_schedule(0)
    assert schedule is not None and schedule.off == ((0.0, 2.5), (10.0, 12.0))
    assert not schedule.online(1.0) and schedule.online(3.0) and schedule.next_online(11) == 12
    assert run.online_schedule(1) is None  # in the class, never off in the trace
    assert run.online_schedule(3) is None  # in the trace, not in the class
    # the periods travel in the run's settings, not the path
    again = RunConfig.model_validate_json(run.model_dump_json())
    (tmp_path / "off.csv").unlink()
    assert RunConfig.model_validate_json(run.model_dump_json()) == again == run


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("agent,from,until\n0,1,2\n", "the first line must be agent,off_from_s,off_until_s"),
        ("agent,off_from_s,off_until_s\n0,1\n", "line 2: expected agent,off_from_s"),
        ("agent,off_from_s,off_until_s\n0,x,2\n", "line 2: expected"),
        ("agent,off_from_s,off_until_s\n0,1,2\n0,3,3\n", "line 3: an agent index of 0 or more"),
        ("agent,off_from_s,off_until_s\n-1,1,2\n", "line 2"),
    ],
)
def test_a_bad_trace_file_is_refused_saying_where(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "off.csv").write_text(text)
    trace = {"kind": "trace", "file": str(tmp_path / "off.csv")}
    with pytest.raises(ConfigError, match=says):
        config(4, [{"name": "t", "agents": [0], "availability": trace}])


def test_a_missing_trace_file_or_one_given_to_another_kind_is_refused(tmp_path: Path) -> None:
    def classes(availability: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"name": "t", "agents": [0], "availability": availability}]

    with pytest.raises(ConfigError, match=r"availability trace .*nope\.csv"):
        config(4, classes({"kind": "trace", "file": str(tmp_path / "nope.csv")}))
    with pytest.raises(ConfigError, match="needs file"):
        config(4, classes({"kind": "trace"}))
    with pytest.raises(ConfigError, match="takes no file"):
        config(4, classes({"kind": "periodic", "on_s": 1, "off_s": 1, "file": "x"}))


def test_a_traced_device_that_is_off_holds_its_first_rounds_on_the_virtual_clock(
    tmp_path: Path,
) -> None:
    (tmp_path / "off.csv").write_text("agent,off_from_s,off_until_s\n1,0,4\n")
    trace = {"kind": "trace", "file": str(tmp_path / "off.csv")}
    fleet = virtual(None, [{"name": "late", "agents": [1], "availability": trace}])
    first = {a: next(r for r in rs if r.round == 1).wall_s for a, rs in fleet.records().items()}
    assert first["agent-1"] >= 4.0 > max(v for a, v in first.items() if a != "agent-1")
