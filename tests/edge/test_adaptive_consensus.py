"""dpsgd-ac (DSGD-AC): the consensus-step schedule and the damped mix (replicas kept apart at
D-PSGD's bytes on a whole fleet: tests/emulation/test_paper_fleets.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from airgossip.common.topology import Phase
from airgossip.edge.algorithms import (
    AdaptiveConsensusDPSGD,
    GossipAlgorithm,
    Payload,
    create_algorithm,
)
from airgossip.edge.algorithms.adaptive_consensus import AdaptiveConsensusOptions, consensus_step
from tests.support.lossy import AlgorithmFleet


def options(**values: Any) -> AdaptiveConsensusOptions:
    return AdaptiveConsensusOptions.model_validate(values)


def test_the_learning_rate_shape_follows_the_learning_rate_after_warm_up() -> None:
    schedule = options(warmup_rounds=5, power=2, gamma_min=0.1, gamma_max=0.9)
    assert consensus_step(schedule, 3, 0.01) == 0.9  # warm-up: the full step
    assert consensus_step(schedule, 6, 1.0) == pytest.approx(0.9)
    assert consensus_step(schedule, 6, 0.5) == pytest.approx(0.1 + 0.8 * 0.25)
    assert consensus_step(schedule, 6, 0.0) == pytest.approx(0.1)
    assert consensus_step(options(), 1, 0.1) == pytest.approx(1e-3)  # the defaults: 1 * 0.1**3


def test_the_ramp_shape_brings_replicas_together_late() -> None:
    ramp = options(shape="ramp", ramp_rounds=10, gamma_min=0.2)
    steps = [consensus_step(ramp, r, 1.0) for r in (0, 5, 10, 50)]
    assert steps == pytest.approx([0.2, 0.6, 1.0, 1.0])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gamma_min": 0.5, "gamma_max": 0.4}, r"gamma_min \(0.5\) must not exceed gamma_max"),
        ({"shape": "ramp"}, "shape 'ramp' needs ramp_rounds"),
        ({"ramp_rounds": 5}, "ramp_rounds belongs to shape 'ramp'"),
        ({"shape": "cosine"}, "option 'shape'"),
        ({"gamma_max": 0}, "option 'gamma_max'"),
        ({"gama": 1}, r"unknown option 'gama' \(allowed: shape, gamma_max"),
    ],
)
def test_bad_options_are_refused_with_what_is_allowed(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=rf"algorithm 'dpsgd-ac': .*{message}"):
        create_algorithm("dpsgd-ac", torch.zeros(3), dtype=torch.float32, options=values)


def test_the_mix_moves_a_gamma_share_of_the_way_to_the_neighbours_average() -> None:
    algo = create_algorithm("dpsgd-ac", torch.zeros(2), dtype=torch.float64, options={"power": 1})
    assert isinstance(algo, AdaptiveConsensusDPSGD)
    algo.share(Phase(0.5, {"b": 0.5}, ("b",)), set())
    algo.receive("b", Payload(torch.full((2,), 4.0, dtype=torch.float64), {}, 1, 0))
    algo.on_local_step(1, {"lr": 0.2})
    algo.on_local_step(2, {"lr": 0.05})  # a quarter of the largest rate: gamma 0.25
    assert algo.scalars() == {"gamma": pytest.approx(0.25)}
    algo.mix()
    torch.testing.assert_close(algo.estimate(), torch.full((2,), 0.25 * 2.0, dtype=torch.float64))


def test_with_a_constant_rate_it_is_dpsgd_and_without_a_rate_it_says_so() -> None:
    def step(i: int, algo: GossipAlgorithm) -> None:
        algo.on_local_step(1, {"lr": 0.1})  # a constant rate: gamma stays at gamma_max

    ac = AlgorithmFleet.build("dpsgd-ac", 6, topology="ring", seed=2)
    plain = AlgorithmFleet.build("dpsgd", 6, topology="ring", seed=2)
    ac.run(30, loss=0.2, seed=1, local_step=step)
    plain.run(30, loss=0.2, seed=1, local_step=step)
    for a, b in zip(ac.algos, plain.algos, strict=True):
        assert torch.equal(a.estimate(), b.estimate())
    with pytest.raises(ValueError, match="train metric 'lr'"):
        ac.algos[0].on_local_step(2, {"train_loss": 0.3})
