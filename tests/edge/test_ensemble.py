"""Ensemble compression (EC-DNN): the algorithm's teachers and the task's independent starts
and distillation (C4 on whole fleets: tests/emulation/test_paper_fleets.py)."""

from __future__ import annotations

import pytest
import torch

from airgossip.common.topology import Phase
from airgossip.edge.agent import build_agent, fleet_digest
from airgossip.edge.algorithms import EnsembleCompression, Payload, create_algorithm
from airgossip.edge.compression import get_codec
from airgossip.edge.settings import AgentSettings
from airgossip.edge.tasks import TaskContext, TrainConfig, load_task
from airgossip.edge.tasks.digits import DigitsTask
from airgossip.edge.transport import InMemoryNetwork, InMemoryTransport

AGENTS = 4


def digits(index: int, init: str, **options: object) -> DigitsTask:
    task = load_task("digits", TaskContext(index, AGENTS, 0, options={"init": init, **options}))
    assert isinstance(task, DigitsTask)
    return task


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
