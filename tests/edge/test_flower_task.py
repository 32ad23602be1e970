"""Flower ClientApps as tasks, in-process: what each agent hands the app, what it takes
back, and one clear error for every way an app can fail."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from airgossip.edge.tasks import TaskContext, TaskError, TrainConfig, load_task
from airgossip.edge.tasks.flower import FlowerAppError, load_flower_app
from tests.support.cli import ROOT

APPS = "tests.edge.flower_apps"
EXAMPLE = str(ROOT / "examples" / "flower-digits")


def flower(index: int, agents: int = 3, seed: int = 0, **options: Any) -> Any:
    options.setdefault("server_app", f"{APPS}:server")
    options.setdefault("run_config", {"scale": 2})
    return load_task("flower", TaskContext(index, agents, seed, options=options))


def test_agents_start_from_the_serverapps_first_broadcast_and_step_by_the_apps_arrays() -> None:
    tasks = [flower(i, app=f"{APPS}:recording") for i in range(3)]
    starts = [t.initial_parameters() for t in tasks]
    # The ServerApp draws its model from numpy's global RNG: seeded by the fleet seed.
    np.random.seed(0)
    expected = np.concatenate([np.random.standard_normal(s).astype(np.float32).ravel()
                               for s in ((3, 2), (2,))])  # fmt: skip
    for start in starts:
        assert torch.equal(start, torch.from_numpy(expected))
    task = tasks[1]
    for round_index in (1, 2):
        result = task.train(starts[1], TrainConfig(round_index, 5))
        assert torch.allclose(result.parameters, starts[1] + 1)
        assert result.metrics == {"train_loss": 0.25} and result.num_examples == 10
    seen = dict(task.client.context.state.config_records["seen"])
    assert seen == {
        "partition-id": 1, "num-partitions": 3, "server-round": 2, "lr": 0.5, "scale": 2,
        "calls": 2, "message-type": "train",
    }  # fmt: skip
    evaluation = task.evaluate(starts[1])
    assert evaluation.metrics == pytest.approx(
        {"accuracy": 0.5, "loss": float(expected.sum()), "f1": 0.75}, rel=1e-5
    )
    assert evaluation.num_examples == 7


def test_another_seed_another_start() -> None:
    one = flower(0, app=f"{APPS}:recording").initial_parameters()
    other = flower(0, app=f"{APPS}:recording", seed=1).initial_parameters()
    assert not torch.equal(one, other)


def test_a_project_folder_gives_its_apps_and_run_config() -> None:
    app = load_flower_app(EXAMPLE, {"local-epochs": 2})
    assert app.client_ref == "flowerdigits.client_app:app"
    assert app.server_ref == "flowerdigits.server_app:app"
    assert app.run_config["local-epochs"] == 2 and app.run_config["num-server-rounds"] == 20
    task = load_task("flower", TaskContext(0, 4, 0, options={"app": EXAMPLE}))
    assert task.layout.names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert "its first train message" in task.source
    result = task.train(task.initial_parameters(), TrainConfig(1, 20))
    assert result.parameters.shape == task.initial_parameters().shape
    assert set(task.evaluate(result.parameters).metrics) == {"accuracy", "loss"}


def test_a_legacy_numpy_client_starts_from_its_own_get_parameters() -> None:
    tasks = [load_task("flower", TaskContext(i, 4, 0, options={
        "app": "examples.flower_legacy_client:app"})) for i in range(2)]  # fmt: skip
    assert torch.equal(tasks[0].initial_parameters(), tasks[1].initial_parameters())
    assert tasks[0].client.legacy and "get_parameters" in tasks[0].source
    result = tasks[0].train(tasks[0].initial_parameters(), TrainConfig(1, 5))
    assert not torch.equal(result.parameters, tasks[0].initial_parameters())
    assert result.num_examples > 0 and "train_loss" in result.metrics
    metrics = tasks[0].evaluate(result.parameters).metrics
    assert set(metrics) == {"accuracy", "loss"} and 0 <= metrics["accuracy"] <= 1


def test_a_bare_client_app_starts_from_its_own_query_reply() -> None:
    tasks = [load_task("flower", TaskContext(i, 4, 0, options={
        "app": f"{APPS}:bare_digits"})) for i in range(2)]  # fmt: skip
    start = tasks[0].initial_parameters()
    # The app draws its model from torch's global RNG: seeded by the fleet seed.
    assert torch.equal(start, tasks[1].initial_parameters())
    assert "the ClientApp's own query reply (no ServerApp)" in tasks[0].source
    assert tasks[0].layout.names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    other = load_task("flower", TaskContext(0, 4, 1, options={"app": f"{APPS}:bare_digits"}))
    assert not torch.equal(start, other.initial_parameters())
    # The reply's ConfigRecord (lr) is the config of every round's train message.
    result = tasks[0].train(start, TrainConfig(1, 5))
    assert result.num_examples > 0 and not torch.equal(result.parameters, start)
    assert 0 <= tasks[0].evaluate(result.parameters).metrics["accuracy"] <= 1


@pytest.mark.parametrize(
    ("app", "what"),
    [
        ("raises", "its train handler raised RuntimeError: out of memory on the device"),
        ("no_arrays", "its train reply holds no arrays"),
        ("wrong_shape", "array 'w' of shape (2, 3), the model's is (3, 2)"),
        ("wrong_dtype", "array 'b' of dtype float64, the model's is float32"),
    ],
)
def test_a_failing_app_gets_one_error_naming_app_agent_and_what(app: str, what: str) -> None:
    task = flower(1, app=f"{APPS}:{app}")
    with pytest.raises(TaskError) as err:
        task.train(task.initial_parameters(), TrainConfig(1, 5))
    message = str(err.value)
    assert message.startswith(f"flower app '{APPS}:{app}' on agent-1: ")
    assert what in message and "\n" not in message


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        ({"app": "no/such/app"}, ["'no/such/app' is neither a folder nor module:attr"]),
        ({"app": f"{APPS}:nothing"}, ["Unable to load attribute nothing"]),
        ({"app": f"{APPS}:server"}, ["is a ServerApp, not a ClientApp"]),
        ({"app": f"{APPS}:recording", "server_app": None},
         ["Message API ClientApp with no ServerApp and no query handler", "--server-app",
          "@app.query()"]),
        ({"app": EXAMPLE, "run_config": {"epochs": 3}},
         ["run config has no key 'epochs'", "local-epochs"]),
        ({"app": f"{APPS}:recording", "colour": "red"}, ["unknown option 'colour'"]),
    ],
)  # fmt: skip
def test_apps_that_cannot_load_are_refused_in_one_line(
    options: dict[str, Any], fragments: list[str]
) -> None:
    options.setdefault("server_app", f"{APPS}:server")
    if options["server_app"] is None:
        del options["server_app"]
    with pytest.raises(TaskError) as err:
        load_task("flower", TaskContext(0, 2, 0, options=options))
    assert "\n" not in str(err.value)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_a_metric_named_but_not_reported_is_an_error() -> None:
    task = flower(0, app=f"{APPS}:recording", accuracy_metric="top1")
    with pytest.raises(FlowerAppError, match=r"no metric 'top1'.*eval_acc"):
        task.evaluate(task.initial_parameters())
    named = flower(0, app=f"{APPS}:recording", accuracy_metric="f1", loss_metric="eval_acc")
    assert named.evaluate(named.initial_parameters()).metrics["accuracy"] == 0.75


def test_a_serverapp_waiting_for_more_nodes_than_agents_is_refused() -> None:
    with pytest.raises(FlowerAppError, match="more nodes than the fleet's 2 agents"):
        flower(0, agents=2, app=f"{APPS}:recording", server_app=f"{APPS}:needs_five")
