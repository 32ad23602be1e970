"""``[privacy]`` in runs: epsilon in every round record, ``results.json``, the summary and
``/metrics``; a budget that stops training (or warns); one clear line for every setting that
cannot work; Flower apps with Flower's own ``LocalDpMod`` on the mesh."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from airgossip.edge.observability.metrics import AgentMetrics
from airgossip.edge.privacy.figures import EPSILON, EXHAUSTED, Spent
from airgossip.scenario.results import summarise
from tests.support.cli import assert_one_line_error, cli
from tests.support.inproc import inproc_fleet

pytest.importorskip("opacus")

DIGITS = {"name": "digits", "hidden": 8, "lr": 2.0, "lr_decay_at": 1.0}


def privacy_run(**privacy: Any) -> Any:
    return inproc_fleet(
        agents=4, rounds=3, topology="exponential", task=DIGITS, network={"loss": 0.0},
        privacy=privacy,
    )  # fmt: skip


def test_every_record_carries_what_its_agent_spent_up_to_the_target() -> None:
    fleet = privacy_run(mechanism="cancelling", target_epsilon=2.0)
    records = fleet.records()
    for agent_records in records.values():
        spent = [Spent.from_metrics(r.metrics) for r in agent_records]
        assert [s.steps for s in spent if s] == [0, 1, 2, 3]
        epsilons = [s.epsilon for s in spent if s]
        assert epsilons[0] == 0 and epsilons == sorted(epsilons)
        assert 1.95 <= epsilons[-1] <= 2.0
    results = summarise(records)
    assert results.final.privacy_epsilon == pytest.approx(max(
        r[-1].metrics[EPSILON] for r in records.values()))  # fmt: skip
    assert results.rounds[0].privacy_epsilon == 0.0


@pytest.mark.parametrize("mechanism", ["cancelling", "central", "dp-sgd"])
def test_with_gossip_rounds_only_every_kth_round_trains_and_spends(mechanism: str) -> None:
    # 7 rounds, a private step every 3: rounds 1, 4 and 7 train and spend, the others only
    # gossip; calibrated for 3 steps, the target is reached by the last round.
    fleet = inproc_fleet(
        agents=4, rounds=7, topology="exponential", task=DIGITS, network={"loss": 0.0},
        privacy={"mechanism": mechanism, "target_epsilon": 2.0, "gossip_rounds": 3},
    )  # fmt: skip
    records = fleet.records()
    for agent_records in records.values():
        spent = [Spent.from_metrics(r.metrics) for r in agent_records]
        assert [s.steps for s in spent if s] == [0, 1, 1, 1, 2, 2, 2, 3]
        assert 1.95 <= spent[-1].epsilon <= 2.0  # type: ignore[union-attr]
    single = inproc_fleet(
        agents=4,
        rounds=3,
        topology="exponential",
        task=DIGITS,
        network={"loss": 0.0},
        privacy={"mechanism": mechanism, "target_epsilon": 2.0},
    ).records()  # the same 3 steps, one a round: the same noise, so the same epsilon
    assert summarise(single).final.privacy_epsilon == pytest.approx(
        summarise(records).final.privacy_epsilon, rel=1e-9
    )


def test_network_dp_reports_the_pairwise_guarantee_of_the_graph(tmp_path: Path) -> None:
    scenario = tmp_path / "network.toml"
    scenario.write_text(
        'agents = 6\nrounds = 4\ntopology = "exponential"\nmode = "inproc"\n'
        '[task]\nname = "digits"\nhidden = 8\n[network]\nloss = 0.0\n'
        '[privacy]\nmechanism = "network-dp"\ntarget_epsilon = 3.0\n'
    )
    out = tmp_path / "run"
    result = cli("run", "--config", str(scenario), "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((out / "results.json").read_text())
    privacy = data["privacy"]
    assert privacy["mechanism"] == "network-dp" and privacy["accountant"] == "gaussian"
    pairwise = privacy["pairwise"]
    assert pairwise["exact"] and pairwise["mean"] == pytest.approx(3.0, abs=0.02)
    assert pairwise["min"] < pairwise["mean"] < pairwise["max"] == privacy["epsilon"]
    # Farther agents learn less: the mean epsilon falls with the distance in hops.
    by_distance = [pairwise["by_distance"][k] for k in sorted(pairwise["by_distance"])]
    assert by_distance == sorted(by_distance, reverse=True) and len(by_distance) >= 2
    assert data["final"]["privacy_epsilon"] == pytest.approx(privacy["epsilon"])
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").exists() else ""
    assert "network-dp · ε mean 3" in result.stdout + summary


def test_the_summary_and_results_name_the_mechanism_and_what_it_spent(tmp_path: Path) -> None:
    scenario = tmp_path / "dp.toml"
    scenario.write_text(
        'agents = 3\nrounds = 3\nmode = "inproc"\n[task]\nname = "digits"\nhidden = 8\n'
        '[privacy]\nmechanism = "dp-sgd"\nnoise_multiplier = 1.0\nsample_rate = 0.1\n'
        "steps_per_round = 2\n"
    )
    out = tmp_path / "run"
    result = cli("run", "--config", str(scenario), "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    privacy = json.loads((out / "results.json").read_text())["privacy"]
    assert privacy["noise_multiplier"] == 1.0 and privacy["accounted_multiplier"] == 1.0
    assert privacy["accountant"] == "rdp" and privacy["delta"] == 1e-5
    line = next(x for x in result.stdout.splitlines() if x.strip().startswith("privacy"))
    assert f"dp-sgd · ε {privacy['epsilon']:.3g} (most any agent spent) at δ 1e-05" in line


def test_cancelling_against_an_eavesdropper_says_so_in_results_and_summary(
    tmp_path: Path,
) -> None:
    figures = {}
    for adversary in ("curious-agent", "eavesdropper"):
        scenario = tmp_path / f"{adversary}.toml"
        scenario.write_text(
            'agents = 4\nrounds = 2\nmode = "inproc"\ntopology = "exponential"\n'
            '[task]\nname = "digits"\nhidden = 8\n[privacy]\nmechanism = "cancelling"\n'
            f'noise_multiplier = 2.0\nadversary = "{adversary}"\n'
        )
        out = tmp_path / adversary
        result = cli("run", "--config", str(scenario), "--out", str(out))
        assert result.returncode == 0, result.stdout + result.stderr
        figures[adversary] = json.loads((out / "results.json").read_text())["privacy"]
        assert figures[adversary]["adversary"] == adversary
        line = next(x for x in result.stdout.splitlines() if x.strip().startswith("privacy"))
        assert ("against an eavesdropper" in line) == (adversary == "eavesdropper")
    # The same noise: the eavesdropper, knowing no mask, is accounted at more noise, less ε.
    curious, eavesdropper = figures["curious-agent"], figures["eavesdropper"]
    assert curious["noise_multiplier"] == eavesdropper["noise_multiplier"] == 2.0
    assert eavesdropper["accounted_multiplier"] > curious["accounted_multiplier"] > 2.0
    assert 0 < eavesdropper["epsilon"] < curious["epsilon"]


def test_a_budget_stops_training_before_it_is_overspent_or_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    common = {"mechanism": "dp-sgd", "noise_multiplier": 1.0, "sample_rate": 0.2}
    unlimited = privacy_run(**common).records()
    per_round = [r.metrics[EPSILON] for r in unlimited["agent-0"]]
    budget = (per_round[1] + per_round[2]) / 2  # one round fits, the second would overspend
    stopped = privacy_run(**common, budget_epsilon=budget).records()
    for records in stopped.values():
        last = records[-1].metrics
        assert last[EPSILON] == pytest.approx(per_round[1]) and last[EPSILON] <= budget
        assert last[EXHAUSTED] == 1.0
    stopping = [r for r in caplog.records if "stops training on its data" in r.getMessage()]
    assert len(stopping) == 4  # once per agent
    caplog.clear()
    warned = privacy_run(**common, budget_epsilon=budget, on_budget="warn").records()
    assert warned["agent-0"][-1].metrics[EPSILON] == pytest.approx(per_round[3])
    assert per_round[3] > budget
    assert len([r for r in caplog.records if "past the budget" in r.getMessage()]) == 4


def test_an_unbounded_epsilon_is_left_out_of_round_reports() -> None:
    from airgossip.coordinator.convert import record_from_proto, record_to_proto

    fleet = privacy_run(mechanism="dp-sgd", noise_multiplier=0.0)  # no noise: no guarantee
    last = fleet.records()["agent-0"][-1]
    assert EPSILON not in last.metrics and Spent.from_metrics(last.metrics) == Spent(math.inf, 3)
    # The coordinator takes the report (it refuses figures that are not finite).
    back = record_from_proto("agent-0", record_to_proto(last, estimate_limit=1 << 20))
    assert Spent.from_metrics(back.metrics) == Spent(math.inf, 3)
    assert summarise(fleet.records()).final.privacy_epsilon == math.inf
    metrics = AgentMetrics("agent-0")
    metrics.record(last)
    assert metrics.registry.get_sample_value("airgossip_agent_privacy_epsilon") == math.inf


def test_metrics_export_epsilon_and_infinity_without_a_mechanism() -> None:
    from prometheus_client import generate_latest

    fleet = privacy_run(mechanism="central", noise_multiplier=2.0)
    metrics = AgentMetrics("agent-0")
    text = generate_latest(metrics.registry).decode()
    assert "airgossip_agent_privacy_epsilon +Inf" in text
    last = fleet.records()["agent-0"][-1]
    metrics.record(last)
    value = metrics.registry.get_sample_value("airgossip_agent_privacy_epsilon")
    assert value == pytest.approx(last.metrics[EPSILON]) and 0 < value < math.inf
    assert metrics.registry.get_sample_value("airgossip_agent_privacy_budget_exhausted") == 0


@pytest.mark.parametrize(
    ("privacy", "fragments"),
    [
        ('mechanism = "dp-sgd"', ["needs exactly one of noise_multiplier or target_epsilon"]),
        ('mechanism = "laplace"', ["privacy.mechanism", "dp-sgd"]),
        ('mechanism = "central"\nnoise_multiplier = 1\nsteps_per_round = 3',
         ["takes one noisy step per round"]),
        ('mechanism = "dp-sgd"\ntarget_epsilon = 1e-6', ["target_epsilon 1e-06 cannot be reached"]),
        ('mechanism = "dp-sgd"\nnoise_multiplier = 1\ndelta = 2', ["privacy.delta"]),
        ('mechanism = "dp-sgd"\nnoise_multiplier = 1\nadversary = "eavesdropper"',
         ["adversary = 'eavesdropper' is for mechanism 'cancelling' only"]),
        ('mechanism = "cancelling"\nnoise_multiplier = 1\nadversary = "neighbour"',
         ["privacy.adversary", "curious-agent", "eavesdropper"]),
        ('mechanism = "network-dp"\nnoise_multiplier = 1\ngossip_rounds = 4',
         ["'network-dp' is accounted for one noisy step every round", "gossip_rounds = 4"]),
        ('mechanism = "cancelling"\nnoise_multiplier = 1\ngossip_rounds = 0',
         ["privacy.gossip_rounds"]),
        ('mechanism = "cancelling"\nnoise_multiplier = 1\nmask_ratio = 2\nmask_multiplier = 2',
         ["give mask_multiplier", "or mask_ratio", "not both"]),
        ('mechanism = "central"\nnoise_multiplier = 1\nmask_ratio = 2',
         ["mask_ratio is for mechanism 'cancelling' only"]),
    ],
)  # fmt: skip
def test_settings_that_cannot_work_get_one_line(
    privacy: str, fragments: list[str], tmp_path: Path
) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text(f'agents = 3\nrounds = 2\nmode = "inproc"\n[privacy]\n{privacy}\n')
    result = cli("run", "--config", str(scenario), "--out", str(tmp_path / "out"))
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_task_that_cannot_clip_per_example_and_a_changing_graph_are_refused(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "consensus.toml"
    scenario.write_text(
        'agents = 3\nrounds = 2\nmode = "inproc"\n[task]\nname = "consensus"\n'
        '[privacy]\nmechanism = "dp-sgd"\nnoise_multiplier = 1\n'
    )
    assert_one_line_error(
        cli("run", "--config", str(scenario)),
        "task 'consensus' does not expose its model and data", "LocalDpMod",
    )  # fmt: skip
    switching = tmp_path / "switching.toml"
    switching.write_text(
        'agents = 4\nrounds = 4\nmode = "virtual"\n[switching]\n'
        'topologies = ["complete", "ring"]\nat_rounds = [2]\n'
        '[privacy]\nmechanism = "network-dp"\nnoise_multiplier = 1\n'
    )
    assert_one_line_error(
        cli("run", "--config", str(switching)), "accounted for one fixed graph", "cancelling"
    )


def test_flower_apps_with_flowers_local_dp_mod_keep_working_on_the_mesh() -> None:
    from airgossip.edge.tasks import TaskContext, TrainConfig, load_task

    apps = "tests.edge.flower_apps"
    options = {
        "app": f"{apps}:local_dp",
        "server_app": f"{apps}:server",
        "run_config": {"scale": 2},
    }
    task = load_task("flower", TaskContext(0, 3, 0, options=options))
    start = task.initial_parameters()
    step = task.train(start, TrainConfig(1, 2)).parameters - start
    # The app adds 1 to each of 8 values (norm 2.83); the mod clips the update to 0.5 and adds
    # noise of std 0.5 * sqrt(2 ln(1.25 / 1e-5)) / 1000, about 0.0024.
    assert float(torch.linalg.vector_norm(step)) == pytest.approx(0.5, abs=0.02)
    fleet = inproc_fleet(agents=3, rounds=2, task={"name": "flower", **options},
                         network={"loss": 0.0})  # fmt: skip
    records = fleet.records()
    assert all(r[-1].round == 2 and r[-1].final for r in records.values())
    moved = [float(torch.linalg.vector_norm(a.algorithm.estimate().float() - start))
             for a in fleet.agents]  # fmt: skip
    assert all(0.5 < m < 1.1 for m in moved)  # two clipped steps of 0.5, averaged
