"""The rest of the seed papers' claims on whole fleets, each run a scenario's settings through
the in-process fleet: C4 (parameter averaging needs a shared start, ensemble compression does
not), C5 (decentralized GD on separable data), local SGD's outer optimizer, DSGD-AC."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch

from airgossip.edge.algorithms import EnsembleCompression, LocalSGD
from airgossip.edge.tasks.digits import DigitsTask
from airgossip.edge.tasks.separable import SeparableOptions, centralized_reference
from airgossip.emulation.fleets.inproc import InProcessFleet
from airgossip.scenario.results import FinalFigures, summarise
from tests.support.inproc import inproc_fleet

SKEWED: dict[str, Any] = {"name": "digits", "partition": "dirichlet", "alpha": 0.1}


def final(fleet: InProcessFleet) -> FinalFigures:
    return summarise(fleet.records()).final


# -- C4: EC-DNN (Sun et al., ECML-PKDD 2017) ----------------------------------------------------
AGENTS, ROUNDS = 4, 40
#: Whether averaging independent starts loses 0.15 depends on the draw: single seeds lose
#: from 0.04 to 0.36 (docs/algorithms.md), so C4 is checked on the mean over these seeds.
C4_SEEDS = (0, 1, 2, 3, 4)


def judge(fleet: InProcessFleet) -> DigitsTask:
    task = fleet.agents[0].task
    assert isinstance(task, DigitsTask)
    return task


@lru_cache(maxsize=16)
def alone(init: str, seed: int = 0) -> tuple[float, float, float]:
    """4 agents train on disjoint IID digits shards for 40 rounds and never talk (local SGD
    whose first average would come after the run); then their models are combined.
    Returns (mean local accuracy, accuracy of the parameter average, of the output ensemble)."""
    fleet = inproc_fleet(
        agents=AGENTS, topology="complete", algorithm="local-sgd", rounds=ROUNDS,
        eval_every=ROUNDS, seed=seed, task={"name": "digits", "init": init},
        algorithm_options={"period": ROUNDS + 1}, network={"loss": 0.0},
    )  # fmt: skip
    models = [agent.algorithm.estimate() for agent in fleet.agents]
    figures = final(fleet)
    local = figures.mean_accuracy
    assert local is not None and figures.bytes_sent == 0  # nobody talked
    average = judge(fleet).evaluate(torch.stack(models).mean(dim=0)).metrics["accuracy"]
    return local, average, judge(fleet).evaluate_ensemble(models).metrics["accuracy"]


def averaging_loss(init: str) -> float:
    """Mean over :data:`C4_SEEDS` of the mean local accuracy minus the average's."""
    return float(np.mean([alone(init, s)[0] - alone(init, s)[1] for s in C4_SEEDS]))


def test_c4_averaging_same_initialised_models_loses_at_most_0_01() -> None:
    assert averaging_loss("shared") <= 0.01


def test_c4_averaging_independently_initialised_models_loses_at_least_0_15() -> None:
    assert averaging_loss("independent") >= 0.15


def test_averaging_independent_models_loses_what_averaging_shared_ones_does_not() -> None:
    shared_local, shared_average, _ = alone("shared")
    local, average, ensemble = alone("independent")
    assert local - average > (shared_local - shared_average) + 0.05
    assert ensemble > local  # the outputs combine where the parameters do not


def test_c4_ensemble_compression_of_independent_models_ends_near_their_output_ensemble() -> None:
    """4 independently initialised agents, complete graph, no loss, a combination every 10
    rounds."""
    fleet = inproc_fleet(
        agents=AGENTS, topology="complete", algorithm="ensemble", rounds=ROUNDS,
        eval_every=ROUNDS, task={"name": "digits", "init": "independent"},
        algorithm_options={"period": 10}, network={"loss": 0.0},
    )  # fmt: skip
    ensembles = []
    for agent in fleet.agents:
        algo = agent.algorithm
        assert isinstance(algo, EnsembleCompression) and len(algo.last_ensemble) == AGENTS
        ensembles.append(judge(fleet).evaluate_ensemble(algo.last_ensemble).metrics["accuracy"])
    # complete graph, no loss: every agent combined the same four models
    assert len(set(ensembles)) == 1
    accuracy = final(fleet).mean_accuracy  # the compressed models, on average
    assert accuracy is not None and accuracy >= ensembles[0] - 0.02
    _, average, _ = alone("independent")
    assert accuracy > average + 0.05  # far above averaging the same start


# -- C5: separable data (Taheri & Thrampoulidis, AISTATS 2023) ----------------------------------
def test_c5_decentralized_gd_on_a_ring_trains_like_centralized_gd() -> None:
    """16 agents, ring, D-PSGD (decentralized GD), no loss, 2,000 steps: every agent's training
    loss on the pooled data within 2x of centralized GD's at the same step, the same test
    error."""
    steps = 2000
    fleet = inproc_fleet(
        agents=16, topology="ring", algorithm="dpsgd", rounds=steps, eval_every=steps,
        task={"name": "separable"}, network={"loss": 0.0},
    )  # fmt: skip
    reference = centralized_reference(0, 16, SeparableOptions(), steps)
    last = [r for records in fleet.records().values() for r in records if r.round == steps]
    assert len(last) == 16
    worst_loss = max(r.metrics["pooled_loss"] for r in last)
    errors = {round(1 - r.metrics["accuracy"], 6) for r in last}
    assert worst_loss <= 2 * reference.pooled_loss[steps]
    assert errors == {round(float(reference.test_error[steps]), 6)}


# -- local SGD's outer optimizer (DiLoCo, PALSGD) -----------------------------------------------
def learn(options: dict[str, Any]) -> tuple[float, int]:
    """Class-skewed digits, 16 agents, complete graph, 10% loss, 80 rounds of local-sgd;
    (mean accuracy, averaging rounds)."""
    fleet = inproc_fleet(
        agents=16, topology="complete", algorithm="local-sgd", rounds=80, eval_every=80,
        task=SKEWED, algorithm_options=options, network={"loss": 0.1},
    )  # fmt: skip
    algo = fleet.agents[0].algorithm
    assert isinstance(algo, LocalSGD)
    accuracy = final(fleet).mean_accuracy
    assert accuracy is not None
    return accuracy, algo.averaging_rounds


def test_outer_nesterov_every_8_rounds_matches_averaging_every_round() -> None:
    """Class-skewed digits (Dirichlet 0.1), 16 agents, complete graph (DiLoCo's all-reduce),
    10% loss, 80 rounds; DiLoCo's outer step (lr 0.7, Nesterov momentum 0.9)."""
    every_round, count_1 = learn({"period": 1})
    outer, count_8 = learn({"period": 8, "outer_lr": 0.7, "outer_momentum": 0.9})
    plain, _ = learn({"period": 8})
    assert count_1 >= 8 * count_8
    assert outer >= every_round - 0.01
    assert plain < every_round - 0.01  # without the outer step, H = 8 loses more


# -- DSGD-AC (Wang & Johansson 2026) ------------------------------------------------------------
def test_dpsgd_ac_keeps_replicas_apart_at_dpsgd_bytes() -> None:
    """Digits, 16 agents, ring, 10% loss, 40 rounds (the learning rate drops tenfold at round
    30, gamma a thousandfold): the same messages as D-PSGD, replicas further apart."""
    figures = {}
    for name in ("dpsgd", "dpsgd-ac"):
        fleet = inproc_fleet(
            agents=16, topology="ring", algorithm=name, rounds=40, eval_every=40,
            task={"name": "digits"}, network={"loss": 0.1},
        )  # fmt: skip
        figures[name] = final(fleet)
    plain, ac = figures["dpsgd"], figures["dpsgd-ac"]
    assert plain.consensus_distance is not None and ac.consensus_distance is not None
    assert ac.consensus_distance > 1.5 * plain.consensus_distance
    assert abs(ac.bytes_sent - plain.bytes_sent) < 1e-3 * plain.bytes_sent  # the header's name
    assert ac.mean_accuracy is not None and plain.mean_accuracy is not None
    assert ac.mean_accuracy > 0.9 and plain.mean_accuracy > 0.9
