"""A ``[privacy]`` run's step size: resolved once with the run's settings (the task's private
default where ``[task]`` sets no ``lr``; the user's where it does), carried as if written so
that every agent and every config read back runs the same, and shown in the run's banner."""

from __future__ import annotations

import json
from pathlib import Path

from airgossip.cli.display import run_banner
from airgossip.edge.tasks.digits import PRIVATE_LR, DigitsOptions
from airgossip.scenario.config import load_config, private_defaults, scenario_toml

PRIVATE = {"privacy": {"mechanism": "cancelling", "target_epsilon": 3.0}}


def test_a_private_run_without_a_step_size_gets_the_private_one() -> None:
    config = load_config(None, PRIVATE)
    assert config.task.options == {"lr": PRIVATE_LR} and PRIVATE_LR == 4.0
    # Only the step size: the task's own decay stays (it was the better one, measured).
    assert "lr_decay_at" not in config.task.options
    assert DigitsOptions.model_validate(config.task.options).lr_decay_at == 0.75
    dp_sgd = load_config(None, {"privacy": {"mechanism": "dp-sgd", "target_epsilon": 8.0}})
    assert dp_sgd.task.options["lr"] == PRIVATE_LR


def test_a_step_size_the_user_set_is_kept(tmp_path: Path) -> None:
    config = load_config(None, {**PRIVATE, "task": {"name": "digits", "lr": 0.5}})
    assert config.task.options == {"lr": 0.5}
    scenario = tmp_path / "private.toml"
    scenario.write_text(
        '[task]\nname = "digits"\nlr = 2.0\nlr_decay_at = 1.0\n'
        '[privacy]\nmechanism = "dp-sgd"\ntarget_epsilon = 8.0\n'
    )
    assert load_config(scenario).task.options == {"lr": 2.0, "lr_decay_at": 1.0}


def test_runs_without_privacy_and_tasks_without_private_defaults_are_left_alone() -> None:
    assert load_config(None, {}).task.options == {}
    off = load_config(None, {"privacy": {"mechanism": "none"}, "task": {"name": "digits"}})
    assert off.task.options == {}
    assert private_defaults("consensus") == {} and private_defaults("mytasks:linear") == {}
    consensus = load_config(None, {**PRIVATE, "task": {"name": "consensus"}})
    assert consensus.task.options == {}


def test_the_resolved_step_size_reads_back_unchanged() -> None:
    """What the launcher writes (``config.json``, a scenario) and every agent reads back is
    the resolved config itself: nothing is resolved again or differently."""
    config = load_config(None, PRIVATE)
    assert load_config(None, json.loads(config.model_dump_json())) == config
    assert "lr = 4.0" in scenario_toml(config)
    assert load_config(None, config.model_dump(mode="json")).task == config.task


def test_the_banner_says_which_step_size_a_private_run_trains_at() -> None:
    banner = run_banner(load_config(None, PRIVATE), "loss 0.1", Path("out"))
    assert "task digits, lr 4 ·" in banner
    own = run_banner(load_config(None, {**PRIVATE, "task": {"lr": 2}}), "loss 0.1", Path("o"))
    assert "task digits, lr 2 ·" in own
    plain = run_banner(load_config(None, {"task": {"lr": 2}}), "loss 0.1", Path("out"))
    assert "task digits ·" in plain
