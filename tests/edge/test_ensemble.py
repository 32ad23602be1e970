"""Ensemble compression (EC-DNN) and C4: parameter averaging needs a shared initialisation;
output averaging plus distillation does not."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from edge.agent import build_agent, fleet_digest
from edge.algorithms import EnsembleCompression, Payload, create_algorithm
from edge.compression import get_codec
from edge.settings import AgentSettings
from edge.tasks import TaskContext, TrainConfig, load_task
from edge.tasks.digits import DigitsTask
from edge.topology import Phase
from edge.transport import InMemoryNetwork, InMemoryTransport
from tests.edge.lockstep import LockStepFleet

AGENTS, ROUNDS = 4, 40


def digits(index: int, init: str, **options: object) -> DigitsTask:
    task = load_task("digits", TaskContext(index, AGENTS, 0, options={"init": init, **options}))
    assert isinstance(task, DigitsTask)
    return task


@lru_cache(maxsize=2)
def averaging(init: str) -> tuple[float, float, float]:
    """4 agents train alone on disjoint shards for 40 rounds; then the parameter average.
    Returns (mean local accuracy, accuracy of the average, accuracy of the output ensemble)."""
    tasks = [digits(i, init) for i in range(AGENTS)]
    models = [t.initial_parameters() for t in tasks]
    for r in range(1, ROUNDS + 1):
        models = [
            t.train(m, TrainConfig(r, ROUNDS)).parameters
            for t, m in zip(tasks, models, strict=True)
        ]
    judge = tasks[0]
    local = sum(judge.evaluate(m).metrics["accuracy"] for m in models) / AGENTS
    average = judge.evaluate(torch.stack(models).mean(dim=0)).metrics["accuracy"]
    return local, average, judge.evaluate_ensemble(models).metrics["accuracy"]


def test_c4_averaging_same_initialised_models_loses_at_most_0_01() -> None:
    local, average, _ = averaging("shared")
    assert average >= local - 0.01


@pytest.mark.xfail(
    strict=True,
    reason="C4's >= 0.15 does not hold for the digits MLP trained by SGD: the average of "
    "independently initialised models loses 0.09 (0.938 -> 0.850); see docs/algorithms.md",
)
def test_c4_averaging_independently_initialised_models_loses_at_least_0_15() -> None:
    local, average, _ = averaging("independent")
    assert average <= local - 0.15


def test_averaging_independent_models_loses_what_averaging_shared_ones_does_not() -> None:
    shared_local, shared_average, _ = averaging("shared")
    local, average, ensemble = averaging("independent")
    assert local - average > (shared_local - shared_average) + 0.05
    assert ensemble > local  # the outputs combine where the parameters do not


def test_c4_ensemble_compression_of_independent_models_ends_near_their_output_ensemble() -> None:
    """4 independently initialised agents, complete graph, a combination every 10 rounds."""
    fleet = LockStepFleet.build(
        AGENTS, "complete", algorithm="ensemble", rounds=ROUNDS, eval_every=ROUNDS,
        task={"name": "digits", "init": "independent"}, algorithm_options={"period": 10},
    )  # fmt: skip
    fleet.run()
    judge = fleet.agents[0].task
    assert isinstance(judge, DigitsTask)
    ensembles = []
    for agent in fleet.agents:
        algo = agent.algorithm
        assert isinstance(algo, EnsembleCompression) and len(algo.last_ensemble) == AGENTS
        ensembles.append(judge.evaluate_ensemble(algo.last_ensemble).metrics["accuracy"])
    # complete graph, no loss: every agent combined the same four models
    assert len(set(ensembles)) == 1
    assert fleet.mean("accuracy") >= ensembles[0] - 0.02  # the compressed models, on average
    _, average, _ = averaging("independent")
    assert fleet.mean("accuracy") > average + 0.05  # far above averaging the same start
    fleet.close()


# -- the algorithm and the task's side ---------------------------------------------------------
def test_teachers_are_the_own_model_and_the_fresh_ones_on_combination_rounds_only() -> None:
    algo = create_algorithm("ensemble", torch.zeros(3), dtype=torch.float32, options={"period": 2})
    assert isinstance(algo, EnsembleCompression)
    phase = Phase(0.5, {"b": 0.5}, ("b", "c"))
    assert algo.share(algo.schedule(1, phase), {"b"}) == {}  # between combinations: silent
    algo.receive("b", Payload(torch.ones(3), {}, 1, 0))  # early: waits for the combination
    algo.mix()
    assert algo.teachers() == []
    sent = algo.share(algo.schedule(2, phase), {"b"})
    assert set(sent) == {"b"} and torch.equal(sent["b"].vector, torch.zeros(3))
    assert algo.receive("c", Payload(torch.full((3,), 2.0), {}, 1, 0)).absorbed
    assert not algo.receive("c", Payload(torch.full((3,), 9.0), {}, 1, 0)).absorbed  # duplicate
    algo.mix()
    teachers = algo.teachers()
    assert [float(t[0]) for t in teachers] == [0.0, 1.0, 2.0]  # own model first
    assert algo.teachers() == []  # handed over once
    algo.share(algo.schedule(4, phase), {"b"})  # nothing arrived this time: nobody to distil
    algo.mix()
    assert algo.teachers() == [] and len(algo.last_ensemble) == 1


def test_ensemble_refuses_sparsifiers_and_tasks_that_cannot_distil() -> None:
    with pytest.raises(ValueError, match="ensemble sends whole models"):
        create_algorithm(
            "ensemble", torch.zeros(3), dtype=torch.float32, codec=get_codec("topk:0.1")
        )
    settings = AgentSettings(algorithm="ensemble", task={"name": "consensus"})  # type: ignore[arg-type]
    transport = InMemoryTransport(InMemoryNetwork(), "a")
    with pytest.raises(ValueError, match="task 'consensus' cannot distil"):
        build_agent("a", index=0, num_agents=2, settings=settings, transport=transport)


def test_independent_initialisation_draws_a_model_per_agent_under_one_digest() -> None:
    tasks = [digits(i, "independent") for i in range(3)]
    starts = [t.initial_parameters() for t in tasks]
    assert not torch.equal(starts[0], starts[1])
    assert torch.equal(starts[0], digits(0, "independent").initial_parameters())  # seeded
    assert len({fleet_digest(t, s) for t, s in zip(tasks, starts, strict=True)}) == 1
    shared = digits(0, "shared")
    assert shared.shared_initialisation and not tasks[0].shared_initialisation


def test_distillation_pulls_the_model_towards_its_teachers_outputs() -> None:
    student, teacher = digits(0, "independent"), digits(1, "independent")
    model = teacher.initial_parameters()
    for r in range(1, 21):
        model = teacher.train(model, TrainConfig(r, 20)).parameters
    start = student.initial_parameters()
    before = student.evaluate_ensemble([start]).metrics["accuracy"]
    result = student.distill(start, [model], TrainConfig(1, 20))
    after = student.evaluate(result.parameters).metrics["accuracy"]
    assert after > before + 0.3 and result.metrics["teachers"] == 1.0
    with pytest.raises(ValueError, match="at least one teacher"):
        student.distill(start, [], TrainConfig(1, 20))
