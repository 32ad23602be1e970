"""The clipping radii of the robust gossip rules, on hand-worked neighbourhoods."""

from __future__ import annotations

import math

import pytest
import torch

from airgossip.edge.algorithms import ALGORITHMS, create_algorithm
from airgossip.edge.algorithms.clipping import (
    clip_scale,
    cs_plus_never_mixes,
    cs_plus_radius,
    insider_weight,
    self_centred_radius,
)


def test_insider_weight_is_the_largest_weights() -> None:
    assert insider_weight([0.1, 0.3, 0.2], 1) == pytest.approx(0.3)
    assert insider_weight([0.1, 0.3, 0.2], 2) == pytest.approx(0.5)
    assert insider_weight([0.1, 0.3], 0) == 0.0


def test_self_centred_radius_sums_the_honest_weight() -> None:
    # Four neighbours of weight 1, one insider: the three nearest are honest.
    radius = self_centred_radius([1.0, 2.0, 2.0, 100.0], [1.0] * 4, 1.0)
    assert radius == pytest.approx(3.0)  # sqrt((1 + 4 + 4) / 1)
    assert self_centred_radius([1.0, 2.0], [1.0, 1.0], 0.0) == math.inf
    assert self_centred_radius([1.0, 2.0], [5.0, 1.0], 1.0) == pytest.approx(math.sqrt(5.0))
    assert self_centred_radius([1.0, 2.0], [1.0, 1.0], 1.5) == 0.0  # nearest outweighs honest


def test_cs_plus_radius_clips_twice_the_insider_weight() -> None:
    # Five neighbours of weight 1, one insider: the 2 farthest are clipped to the 3rd.
    assert cs_plus_radius([5.0, 1.0, 4.0, 2.0, 3.0], [1.0] * 5, 1.0) == 3.0
    assert cs_plus_radius([1.0, 2.0], [1.0, 1.0], 1.0) == 0.0
    assert cs_plus_radius([1.0, 2.0], [1.0, 1.0], 0.0) == math.inf


def test_clip_scale() -> None:
    assert clip_scale(1.0, 2.0) == 1.0
    assert clip_scale(4.0, 2.0) == 0.5


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_starts_with_no_clip_counts(name: str) -> None:
    algorithm = create_algorithm(name, torch.zeros(4), dtype=torch.float64)
    assert not algorithm.clipped_by_sender


def test_robust_push_sum_checkpoints_what_it_holds_back() -> None:
    from airgossip.edge.agent.checkpoints import decode_state, encode_state
    from airgossip.edge.algorithms import Payload

    algorithm = create_algorithm("robust-push-sum", torch.zeros(3), dtype=torch.float64)
    # Far from the receiver's estimate (0): with no radius known yet, all of it is held back.
    algorithm.receive("a", Payload(torch.full((3,), 5.0), {"y": 0.5}, 1, 0))
    algorithm.mix()
    x, y = algorithm.mass()  # type: ignore[attr-defined]
    assert algorithm.clipped_by_sender["a"] == 1
    resumed = create_algorithm("robust-push-sum", torch.zeros(3), dtype=torch.float64)
    resumed.load_state_dict(decode_state(encode_state(algorithm.state_dict())))
    x2, y2 = resumed.mass()  # type: ignore[attr-defined]
    torch.testing.assert_close(x2, x)
    assert y2 == pytest.approx(y)
    assert float(resumed.estimate().abs().max()) == 0.0  # nothing of it absorbed yet


def test_cs_plus_never_mixes_when_twice_the_insiders_outweigh_the_rest() -> None:
    assert cs_plus_never_mixes([1 / 3, 1 / 3], 1)  # a ring: kept weight 0
    assert cs_plus_never_mixes([1 / 9, 1 / 6, 1 / 5], 1)  # degree 3 beside degrees 8, 5, 4
    assert not cs_plus_never_mixes([1 / 9, 1 / 9, 1 / 9], 1)  # the lightest can be nearest
    assert not cs_plus_never_mixes([1 / 3, 1 / 3], 0)
    assert not cs_plus_never_mixes([], 1)
    assert not cs_plus_never_mixes([0.1] * 5, 2)  # 5 neighbours, 2 insiders: one kept
    assert cs_plus_never_mixes([0.1] * 4, 2)
