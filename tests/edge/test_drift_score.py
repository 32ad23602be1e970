"""The drift score (edge/algorithms/drift.py) tells a sender that keeps pulling one way from
honest ones, and robust algorithms count only the clips that cut a pull to less than half."""

from __future__ import annotations

import math

import pytest
import torch

from airgossip.edge.agent.checkpoints import decode_state, encode_state
from airgossip.edge.algorithms import create_algorithm
from airgossip.edge.algorithms.drift import FLOOR, DriftGuard

DIM = 6


def rounds_of_offers(guard: DriftGuard, rounds: int, drift: float, seed: int = 0) -> None:
    """Three honest senders whose displacements turn and fade as a fleet agrees, and
    ``drifter`` offering ``drift`` along one fixed direction every round."""
    generator = torch.Generator().manual_seed(seed)
    direction = torch.ones(DIM, dtype=torch.float64) / math.sqrt(DIM)
    for r in range(rounds):
        fade = 0.9**r
        offered = {
            peer: torch.randn(DIM, generator=generator, dtype=torch.float64) * fade
            for peer in ("a", "b", "c")
        }
        offered["drifter"] = direction * drift
        guard.observe(offered, own_norm=10.0)


def test_a_sender_pulling_one_way_scores_far_above_honest_ones() -> None:
    guard = DriftGuard(4.0, 1)
    rounds_of_offers(guard, 100, drift=1.0)
    honest = [guard.score[p] for p in ("a", "b", "c")]
    assert max(honest) < 3.0, honest
    assert guard.score["drifter"] >= 10.0, guard.score
    # Capped by the floor: 1.0 / (FLOOR * 10) once the honest displacements have faded.
    assert guard.score["drifter"] <= 1.0 / (FLOOR * 10.0) + 1e-9


def test_honest_senders_of_one_size_score_about_one_or_less() -> None:
    guard = DriftGuard(4.0, 1)
    rounds_of_offers(guard, 60, drift=0.0)
    assert all(s < 3.0 for s in guard.score.values()), guard.score
    assert guard.score["drifter"] == pytest.approx(0.0, abs=1e-12)


def test_rounding_noise_under_the_floor_scores_nothing() -> None:
    guard = DriftGuard(4.0, 1)
    tiny = {
        p: torch.full((DIM,), 1e-14 * (i + 1), dtype=torch.float64) for i, p in enumerate("abc")
    }
    for _ in range(30):
        guard.observe(tiny, own_norm=1.0)
    assert max(guard.score.values()) < 1e-9, guard.score


def test_fewer_than_two_others_give_no_score() -> None:
    guard = DriftGuard(4.0, 1)
    guard.observe({"a": torch.ones(DIM), "b": torch.zeros(DIM)}, own_norm=1.0)
    assert guard.score == {}


def test_scores_survive_a_checkpoint_and_leave_with_their_sender() -> None:
    guard = DriftGuard(4.0, 1)
    rounds_of_offers(guard, 30, drift=1.0)
    resumed = DriftGuard(4.0, 1)
    resumed.load_state_dict(decode_state(encode_state(guard.state_dict())), torch.float64)
    assert resumed.score == pytest.approx(guard.score, rel=1e-12)
    resumed.forget({"a", "b"})
    assert set(resumed.score) == {"a", "b"}


@pytest.mark.parametrize("algorithm", ["clipped-gossip", "cs-plus-gossip"])
def test_only_clips_that_cut_a_pull_to_under_half_are_counted(algorithm: str) -> None:
    from airgossip.common.topology.mixing import Phase
    from airgossip.edge.algorithms import Payload

    agent = create_algorithm(algorithm, torch.zeros(2, dtype=torch.float64), dtype=torch.float64)
    peers = {f"p{i}": 0.2 for i in range(4)}
    agent.share(Phase(0.2, peers, tuple(peers)), ready=())
    for seq, offsets in ((1, (1.0, 1.0, 1.5, 1.8)), (2, (1.0, 1.0, 1.5, 100.0))):
        x = agent.estimate()
        for peer, offset in zip(peers, offsets, strict=True):
            agent.receive(peer, Payload(x + torch.tensor([offset, 0.0]), {}, seq, 0))
        agent.mix()
        if seq == 1:
            # cs-plus clips the two farthest to the second nearest's distance (1.8 by 1 / 1.8:
            # not counted); clipped-gossip's radius, sqrt(1 + 1 + 2.25) = 2.06, clips nothing.
            assert not agent.clipped_by_sender
    # 100 against a radius of 1 or 2.06 is cut to under half: counted, and only it.
    assert dict(agent.clipped_by_sender) == {"p3": 1}
