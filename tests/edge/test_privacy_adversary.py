"""The cancelling mechanism against its two adversaries (``[privacy] adversary``): DECOR's
bound for an observer of every link that is no agent, against a direct computation and
against the curious-agent bound it must reduce to; calibration to a target epsilon that
spends the target; settings that mix the option with another mechanism refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from airgossip.common.topology import build_graph
from airgossip.edge.privacy.accounting import OpacusLedger
from airgossip.edge.privacy.graph import (
    cancelling_limit,
    cancelling_noise_multiplier,
    cancelling_sensitivities,
    eavesdropper_sensitivities,
    pair_graph,
)
from airgossip.edge.privacy.noise import resolve_noise
from airgossip.edge.privacy.plan import PrivacyGraph
from airgossip.edge.privacy.settings import PrivacySettings

opacus = pytest.importorskip("opacus")

PATH = pair_graph(np.array([[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]))
EXPONENTIAL = pair_graph(build_graph("exponential", 16).phases[0])


def exponential_fleet(n: int = 16) -> PrivacyGraph:
    graph = build_graph("exponential", n)
    ids = tuple(f"agent-{i}" for i in range(n))
    return PrivacyGraph.of(graph, ids, "column-stochastic", static=True)


def test_the_eavesdropper_sees_every_agent_masked_by_every_pair_on_a_path() -> None:
    # Path 0 - 1 - 2 - 3: the eavesdropper knows no mask, so all three pairs mask.
    sigma, mask = 0.7, 2.0
    incidence = np.array([[1.0, 0, 0], [-1, 1, 0], [0, -1, 1], [0, 0, -1]])
    cov = sigma**2 * np.eye(4) + mask**2 * incidence @ incidence.T
    expected = np.sqrt(np.diag(np.linalg.inv(cov)))
    assert eavesdropper_sensitivities(PATH, sigma, mask) == pytest.approx(expected, rel=1e-12)
    # The worst agent is an end of the path (one mask only).
    worst = cancelling_noise_multiplier(PATH, sigma, mask, "eavesdropper")
    assert worst == pytest.approx(1 / expected[0], rel=1e-12)
    assert expected[0] == pytest.approx(expected.max(), rel=1e-12)


def test_the_eavesdropper_bound_reduces_to_the_curious_agent_one_where_the_model_says() -> None:
    sigma, mask = 1.3, 0.9
    # A curious agent that shares no secret with anyone knows no mask: it sees the others
    # as the eavesdropper sees them (agent 4 below has no pair).
    with_outsider = np.zeros((5, 5), dtype=bool)
    with_outsider[:4, :4] = PATH
    curious = cancelling_sensitivities(with_outsider, sigma, mask)[:4, 4]
    assert curious == pytest.approx(eavesdropper_sensitivities(PATH, sigma, mask), rel=1e-12)
    # No masks: both are the agent's own noise, local DP.
    for adversary in ("curious-agent", "eavesdropper"):
        assert cancelling_noise_multiplier(EXPONENTIAL, sigma, 0.0, adversary) == pytest.approx(
            sigma, rel=1e-12
        )
    # Knowing less, the eavesdropper never learns more than a curious agent.
    for ratio in (0.5, 1.0, 4.0):
        assert cancelling_noise_multiplier(
            EXPONENTIAL, 1.0, ratio, "eavesdropper"
        ) > cancelling_noise_multiplier(EXPONENTIAL, 1.0, ratio, "curious-agent")
    # Masks ever larger: central DP's figure, the noise of all 16 agents on the sum.
    assert cancelling_limit(EXPONENTIAL, "eavesdropper") == pytest.approx(4.0)
    assert cancelling_limit(EXPONENTIAL) == pytest.approx(math.sqrt(15))
    assert cancelling_noise_multiplier(EXPONENTIAL, 1.0, 1e4, "eavesdropper") == pytest.approx(
        4.0, rel=1e-4
    )
    # Without independent noise the sum of the messages shows the sum of the updates.
    assert cancelling_noise_multiplier(EXPONENTIAL, 0.0, 5.0, "eavesdropper") == 0.0
    with pytest.raises(ValueError, match="unknown adversary 'coalition'"):
        cancelling_noise_multiplier(EXPONENTIAL, 1.0, 1.0, "coalition")


@pytest.mark.parametrize("epsilon", [1.0, 3.0, 8.0])
@pytest.mark.parametrize("mask", [None, 5.0])
def test_calibration_against_the_eavesdropper_spends_the_target(
    epsilon: float, mask: float | None
) -> None:
    rounds, fleet = 100, exponential_fleet()
    settings = PrivacySettings(mechanism="cancelling", target_epsilon=epsilon,
                               adversary="eavesdropper", mask_multiplier=mask)  # fmt: skip
    plan = resolve_noise(settings, rounds=rounds, num_agents=16, graph=fleet)
    if mask is not None:
        assert plan.mask_multiplier == mask
    else:
        assert plan.mask_multiplier == pytest.approx(plan.noise_multiplier)
    # What the accountant composes is the bound of the noise it chose...
    effective = cancelling_noise_multiplier(
        pair_graph(fleet.adjacency), plan.noise_multiplier, plan.mask_multiplier, "eavesdropper"
    )
    assert plan.accounted_multiplier == pytest.approx(effective, rel=2e-4)
    # ...and that spends the target by the last round, not before.
    ledger = OpacusLedger(effective, 1.0, 1e-5, "rdp", "cancelling")
    ledger.step(rounds)
    assert epsilon * 0.99 <= ledger.epsilon() <= epsilon * 1.0005
    # Less independent noise than against a curious agent, never less than central DP's
    # share of the same epsilon.
    curious = resolve_noise(
        PrivacySettings(mechanism="cancelling", target_epsilon=epsilon, mask_multiplier=mask),
        rounds=rounds, num_agents=16, graph=fleet,
    )  # fmt: skip
    central = resolve_noise(PrivacySettings(mechanism="central", target_epsilon=epsilon),
                            rounds=rounds, num_agents=16, graph=None)  # fmt: skip
    assert central.noise_multiplier < plan.noise_multiplier < curious.noise_multiplier


def test_a_given_noise_is_accounted_against_the_adversary_named() -> None:
    fleet = exponential_fleet()
    plans = {}
    for adversary in ("curious-agent", "eavesdropper"):
        settings = PrivacySettings(mechanism="cancelling", noise_multiplier=2.0,
                                   adversary=adversary)  # fmt: skip
        plans[adversary] = resolve_noise(settings, rounds=10, num_agents=16, graph=fleet)
    for adversary, plan in plans.items():
        assert plan.noise_multiplier == 2.0 and plan.mask_multiplier == 2.0
        assert plan.accounted_multiplier == pytest.approx(
            cancelling_noise_multiplier(EXPONENTIAL, 2.0, 2.0, adversary), rel=1e-12
        )
    assert plans["eavesdropper"].accounted_multiplier > plans["curious-agent"].accounted_multiplier


def test_the_adversary_is_a_setting_of_cancelling_only() -> None:
    assert PrivacySettings(mechanism="cancelling", noise_multiplier=1).adversary == "curious-agent"
    with pytest.raises(ValidationError) as caught:
        PrivacySettings(mechanism="dp-sgd", noise_multiplier=1, adversary="eavesdropper")
    assert "adversary = 'eavesdropper' is for mechanism 'cancelling' only" in str(caught.value)
    with pytest.raises(ValidationError) as caught:
        PrivacySettings(mechanism="cancelling", noise_multiplier=1, adversary="coalition")
    assert "curious-agent" in str(caught.value) and "eavesdropper" in str(caught.value)


def test_gossip_rounds_calibrate_for_the_private_steps_with_masks_as_large_as_they_allow() -> None:
    # 100 rounds, a private step every 4: calibrated for 25 steps, with masks 4 times the
    # independent noise unless told otherwise; larger masks need less independent noise.
    fleet = exponential_fleet()

    def plan(rounds: int, **privacy: float) -> tuple[float, float, float]:
        settings = PrivacySettings(mechanism="cancelling", target_epsilon=3.0, **privacy)
        p = resolve_noise(settings, rounds=rounds, num_agents=16, graph=fleet)
        return p.noise_multiplier, p.mask_multiplier, p.accounted_multiplier

    sigma, mask, accounted = plan(100, gossip_rounds=4)
    assert (sigma, mask, accounted) == plan(25, mask_ratio=4)
    assert mask == pytest.approx(4 * sigma, rel=1e-12)
    assert accounted == pytest.approx(plan(25)[2], rel=1e-12)  # the same 25 steps' mechanism
    same_masks = plan(100, gossip_rounds=4, mask_ratio=1)
    assert same_masks[1] == pytest.approx(same_masks[0], rel=1e-12)
    assert same_masks == plan(25)
    assert sigma < same_masks[0]
    ledger = OpacusLedger(accounted, 1.0, 1e-5, "rdp", "cancelling")
    ledger.step(25)
    assert 3.0 * 0.99 <= ledger.epsilon() <= 3.0 * 1.0005
