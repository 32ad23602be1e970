"""The separable-data task (Taheri & Thrampoulidis, AISTATS 2023) and its centralized
reference (C5 on a whole fleet: tests/emulation/test_paper_fleets.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from airgossip.edge.tasks import TaskContext, TaskError, TrainConfig, load_task
from airgossip.edge.tasks.separable import (
    SeparableOptions,
    SeparableTask,
    centralized_reference,
    logistic_gradient,
    logistic_loss,
    separable_data,
)


def test_the_data_is_separable_with_a_margin_and_the_same_on_every_agent() -> None:
    options = SeparableOptions(dim=5, samples_per_agent=30, margin=0.2)
    data = separable_data(3, 4, options)
    assert data.train_x.shape == (120, 5) and data.test_x.shape == (2000, 5)
    for x, y in ((data.train_x, data.train_y), (data.test_x, data.test_y)):
        projection = x @ data.direction
        assert bool((projection * y > 0).all())  # w* separates every point ...
        assert float(projection.abs().min()) >= 0.2  # ... with the margin
    tasks = [load_task("separable", TaskContext(i, 4, 3, options={"dim": 5})) for i in range(4)]
    assert all(isinstance(t, SeparableTask) for t in tasks)
    shards = [t.data.shard(i)[0] for i, t in enumerate(tasks)]  # type: ignore[attr-defined]
    torch.testing.assert_close(torch.cat(shards), tasks[0].data.train_x)  # type: ignore[attr-defined]
    assert not torch.equal(separable_data(4, 4, options).train_x, data.train_x)


def test_a_round_is_gradient_descent_on_the_agents_own_shard() -> None:
    task = load_task("separable", TaskContext(1, 2, 0, options={"lr": 0.5, "local_steps": 2}))
    assert isinstance(task, SeparableTask)
    start = task.initial_parameters()
    assert not start.any()  # every agent starts at zero
    result = task.train(start, TrainConfig(1, 10))
    x, y = task.data.shard(1)
    w = torch.zeros(20, dtype=torch.float64)
    for _ in range(2):
        w -= 0.5 * logistic_gradient(w, x, y)
    torch.testing.assert_close(result.parameters.double(), w, rtol=1e-6, atol=1e-7)
    assert result.metrics["lr"] == 0.5
    assert result.metrics["train_loss"] == pytest.approx(logistic_loss(w, x, y), rel=1e-6)
    figures = task.evaluate(result.parameters).metrics
    assert figures["pooled_loss"] < np.log(2)  # better than the zero start on the fleet's data
    assert 0.5 < figures["accuracy"] <= 1.0


def test_centralized_gradient_descent_drives_the_pooled_loss_down() -> None:
    run = centralized_reference(0, 4, SeparableOptions(), 300)
    assert run.pooled_loss[0] == pytest.approx(np.log(2))
    assert bool((np.diff(run.pooled_loss) < 0).all())
    assert run.test_error[-1] < 0.02


def test_bad_options_say_what_is_allowed() -> None:
    with pytest.raises(TaskError, match=r"task 'separable': option 'margin'"):
        load_task("separable", TaskContext(0, 2, 0, options={"margin": 1.5}))
    with pytest.raises(TaskError, match=r"unknown option 'alpha' \(allowed: dim, "):
        load_task("separable", TaskContext(0, 2, 0, options={"alpha": 0.1}))
