"""Tasks: data partitions, identical starts, user tasks and their errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from airgossip.edge.agent import fleet_digest
from airgossip.edge.tasks import TaskContext, TaskError, TrainConfig, load_task
from airgossip.edge.tasks.consensus import ConsensusOptions, consensus_vector, true_average
from airgossip.edge.tasks.digits import DigitsOptions, load_digits_arrays, split_indices


def context(index: int = 0, n: int = 4, seed: int = 0, **options: object) -> TaskContext:
    return TaskContext(agent_index=index, num_agents=n, seed=seed, options=options)


def test_digits_data_is_the_bundled_set() -> None:
    x, y = load_digits_arrays()
    assert x.shape == (1797, 64) and y.shape == (1797,)
    assert x.min() >= 0.0 and x.max() == 1.0
    assert set(np.unique(y)) == set(range(10))


def test_iid_shards_partition_the_training_set() -> None:
    _, y = load_digits_arrays()
    test, shards = split_indices(y, 8, 0, DigitsOptions())
    union = np.concatenate([test, *shards])
    assert len(union) == len(set(union)) == len(y)
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1
    assert len(test) == round(0.2 * len(y))


def test_dirichlet_shards_are_skewed_and_smaller_alpha_skews_more() -> None:
    _, y = load_digits_arrays()

    def skew(alpha: float) -> float:
        _, shards = split_indices(y, 8, 0, DigitsOptions(partition="dirichlet", alpha=alpha))
        shares = [np.bincount(y[s], minlength=10) / len(s) for s in shards]
        return float(np.mean([s.max() for s in shares]))

    _, iid = split_indices(y, 8, 0, DigitsOptions())
    iid_skew = float(np.mean([np.bincount(y[s], minlength=10).max() / len(s) for s in iid]))
    assert iid_skew < skew(1.0) < skew(0.1)


def test_sampled_shards_overlap_and_each_agent_draws_only_its_own() -> None:
    _, y = load_digits_arrays()
    options = DigitsOptions(samples_per_agent=50)
    test, shards = split_indices(y, 1000, 0, options)
    assert len(shards) == 1000 and all(len(s) == len(set(s)) == 50 for s in shards)
    held_out = set(test.tolist())
    assert not any(held_out & set(s.tolist()) for s in shards[:50])
    # 1,000 x 50 images from a pool of 1,438: agents share images, and no two shards match.
    assert len(set(np.concatenate(shards).tolist())) == len(y) - len(test)
    assert len({tuple(s) for s in shards}) == 1000
    # An agent's task draws the same shard without drawing the fleet's.
    task = load_task("digits", context(7, n=1000, samples_per_agent=50))
    assert task.num_train == 50
    assert torch.equal(task._y_train, torch.from_numpy(y[shards[7]]))
    # Unset: the disjoint split as before.
    _, disjoint = split_indices(y, 8, 0, DigitsOptions())
    assert len(np.concatenate(disjoint)) == len(y) - len(test)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"samples_per_agent": 0}, "option 'samples_per_agent'"),
        ({"samples_per_agent": 10, "partition": "dirichlet"}, "cannot be combined with"),
        ({"samples_per_agent": 1500}, "exceeds the 1438 training images"),
    ],
)
def test_sampled_shard_errors_say_what_is_wrong(options: dict, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        load_task("digits", context(**options))


def test_every_agent_starts_from_the_same_model_but_its_own_data() -> None:
    tasks = [load_task("digits", context(i)) for i in range(3)]
    starts = [t.initial_parameters() for t in tasks]
    assert all(torch.equal(starts[0], s) for s in starts)
    digests = {fleet_digest(t, s) for t, s in zip(tasks, starts, strict=True)}
    assert len(digests) == 1
    trained = [t.train(starts[0], TrainConfig(1, 10)).parameters for t in tasks]
    assert not torch.equal(trained[0], trained[1])
    other_seed = load_task("digits", context(0, seed=1)).initial_parameters()
    assert not torch.equal(other_seed, starts[0])


def test_digits_training_does_not_alias_its_input() -> None:
    task = load_task("digits", context())
    start = task.initial_parameters()
    copy = start.clone()
    result = task.train(start, TrainConfig(1, 10))
    assert torch.equal(start, copy)
    assert not torch.equal(result.parameters, start)
    assert result.num_examples == 10 * 16


def test_a_local_epoch_visits_every_training_image_once_per_pass() -> None:
    task = load_task("digits", context(local_epochs=2, batch_size=32))
    batches = task._batches_of_round()
    n = task.num_train
    assert len(batches) == 2 * -(-n // 32)
    first = torch.cat(batches[: len(batches) // 2])
    assert sorted(first.tolist()) == list(range(n))
    result = task.train(task.initial_parameters(), TrainConfig(1, 10))
    assert result.num_examples == 2 * n


def test_consensus_vectors_and_their_average() -> None:
    options = ConsensusOptions(dim=5)
    vectors = [consensus_vector(3, i, options) for i in range(4)]
    torch.testing.assert_close(true_average(3, 4, options), sum(vectors) / 4)
    task = load_task("consensus", context(2, seed=3, dim=5))
    torch.testing.assert_close(task.initial_parameters(), vectors[2])
    assert task.gossip_dtype == torch.float64 and not task.shared_initialisation
    start = task.initial_parameters()
    assert task.train(start, TrainConfig(1, 1)).parameters is start


def test_user_task_from_module_callable() -> None:
    task = load_task("examples.linear_task:make_task", context(features=3))
    assert task.initial_parameters().numel() == 4
    loss = task.evaluate(task.initial_parameters()).metrics["loss"]
    params = task.initial_parameters()
    for r in range(50):
        params = task.train(params, TrainConfig(r, 50)).parameters
    assert task.evaluate(params).metrics["loss"] < loss / 10


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        ("mnist", {}, "unknown task 'mnist'; choose one of: digits, consensus"),
        ("no_such_module:make", {}, "cannot import module 'no_such_module'"),
        ("examples.linear_task:nothing", {}, "has no callable 'nothing'"),
        ("digits", {"partition": "zipf"}, "option 'partition'"),
        ("digits", {"lr": -1}, "option 'lr'"),
        ("digits", {"batchsize": 3}, "unknown option 'batchsize'"),
        ("consensus", {"dim": 0}, "option 'dim'"),
    ],
)
def test_task_errors_say_what_is_wrong(spec: str, options: dict, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        load_task(spec, context(**options))
