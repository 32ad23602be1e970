"""local-sgd with an outer optimizer (DiLoCo, PALSGD) and pseudo-synchronous averaging (on a
whole fleet: tests/emulation/test_paper_fleets.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from airgossip.common.topology import Phase
from airgossip.edge.algorithms import GossipAlgorithm, LocalSGD, create_algorithm
from airgossip.edge.algorithms.local_sgd import LocalSGDOptions
from tests.support.lossy import AlgorithmFleet


def test_the_outer_step_is_nesterov_on_the_pseudo_gradient() -> None:
    """Two agents on the complete graph average exactly; agent 0 moves by +1 each round, agent
    1 by +3, from 0: the average moves by 2 a round, and the outer step acts on that."""
    lr, mu, period = 0.5, 0.8, 2
    options = {"period": period, "outer_lr": lr, "outer_momentum": mu}
    zeros = [torch.zeros(1, dtype=torch.float64) for _ in range(2)]
    fleet = AlgorithmFleet.build(
        "local-sgd", 2, topology="complete", initial=zeros, options=options
    )

    def step(i: int, algo: GossipAlgorithm) -> None:
        algo.apply_update(torch.full((1,), 1.0 + 2 * i, dtype=torch.float64))

    anchor, velocity = 0.0, 0.0
    for _ in range(4):
        fleet.run(period, local_step=step)
        gradient = anchor - (anchor + 2.0 * period)  # anchor minus the average after the steps
        velocity = mu * velocity + gradient
        anchor -= lr * (gradient + mu * velocity)
        for algo in fleet.algos:
            assert float(algo.estimate()) == pytest.approx(anchor, rel=1e-12)
    assert all(isinstance(a, LocalSGD) and a.averaging_rounds == 4 for a in fleet.algos)


def test_without_momentum_an_outer_rate_of_one_is_plain_averaging_bit_for_bit() -> None:
    runs = []
    for options in ({"period": 3}, {"period": 3, "outer_lr": 1.0, "nesterov": False}):
        fleet = AlgorithmFleet.build("local-sgd", 6, options=options, seed=4)
        fleet.run(30, loss=0.2, seed=2, local_step=lambda i, a: a.apply_update(0.01 * a.estimate()))
        runs.append([a.estimate() for a in fleet.algos])
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_pseudo_synchronous_averaging_draws_the_same_rounds_on_every_agent() -> None:
    options = {"probability": 0.25, "schedule_seed": 7}
    phase = Phase(0.5, {"b": 0.5}, ("b",))
    agents = [
        create_algorithm("local-sgd", torch.zeros(2), dtype=torch.float32, seed=s, options=options)
        for s in range(3)
    ]
    drawn = [[r for r in range(1, 2001) if a.schedule(r, phase) is phase] for a in agents]
    assert drawn[0] == drawn[1] == drawn[2]  # the algorithms' own seeds play no part
    assert 0.22 < len(drawn[0]) / 2000 < 0.28
    assert drawn[0] == [r for r in range(1, 2001) if LocalSGDOptions(**options).averages(r)]
    other = [r for r in range(1, 2001) if LocalSGDOptions(probability=0.25).averages(r)]
    assert other != drawn[0]  # another schedule seed, other rounds
    talks = [bool(agents[0].share(agents[0].schedule(r, phase), {"b"})) for r in range(1, 41)]
    assert talks == [r in drawn[0] for r in range(1, 41)]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"period": 4, "probability": 0.25}, "give period .* or probability .*, not both"),
        ({"probability": 0}, "option 'probability'"),
        ({"outer_momentum": 1.0}, "option 'outer_momentum'"),
        ({"outer_lr": -1}, "option 'outer_lr'"),
        ({"outer": 1}, r"unknown option 'outer' \(allowed: period, probability, schedule_seed"),
    ],
)
def test_bad_options_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=rf"algorithm 'local-sgd': .*{message}"):
        create_algorithm("local-sgd", torch.zeros(3), dtype=torch.float32, options=values)
