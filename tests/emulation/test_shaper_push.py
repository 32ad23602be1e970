"""A push's messages decided at once get the verdicts they get asked one by one."""

from __future__ import annotations

import numpy as np

from airgossip.emulation.channel.model import ChannelModel
from airgossip.emulation.networks.shaper import WirelessLinkShaper
from airgossip.scenario.wireless import WirelessSettings


def _shaper(clock: list[float]) -> WirelessLinkShaper:
    settings = WirelessSettings.model_validate(
        {"mobility": {"model": "gauss-markov", "area_m": [400, 400]}, "activity": 0.3,
         "step_s": 0.05, "jitter_ms": 2.0, "burst": {"model": "fading"}}
    )  # fmt: skip
    model = ChannelModel(settings, 30, 5)
    return WirelessLinkShaper(model, [f"a{i}" for i in range(30)], lambda: clock[0],
                              journal=True)  # fmt: skip


def test_a_push_decided_at_once_equals_its_messages_asked_one_by_one() -> None:
    clock = [0.0]
    one, many = _shaper(clock), _shaper(clock)
    rng = np.random.default_rng(3)
    for k in range(300):
        clock[0] = k * 0.004
        sender = int(rng.integers(30))
        messages = [(int(j), k, int(rng.integers(1, 400_000)))
                    for j in rng.choice(30, size=4, replace=False) if j != sender]  # fmt: skip
        expected = []
        for j, index, nbytes in messages:
            verdict = one.plan(f"a{sender}", f"a{j}", 2, index, nbytes)
            expected.append((verdict.drop, verdict.delay_s))
        assert many.plan_push(sender, messages, 2) == expected
    assert one.journal == many.journal and one.journal
    assert one.counters == many.counters
    drops = sum(m.drop for m in one.journal or [])
    assert 0 < drops < len(one.journal or [])  # both kinds of verdict were compared


def test_a_state_for_verdicts_answers_what_a_verdict_asks_and_holds_no_more() -> None:
    from airgossip.emulation.channel.sparse import SparseChannelModel
    from airgossip.emulation.channel.state import NOT_FOR_VERDICTS, SparseLinkState

    settings = WirelessSettings.model_validate(
        {"mobility": {"model": "gauss-markov", "area_m": [600, 600]}, "activity": 0.3,
         "burst": {"model": "fading"}}
    )  # fmt: skip
    full = SparseChannelModel(settings, 80, 4).state(2)
    assert isinstance(full, SparseLinkState)
    slim = full.for_verdicts()
    rng = np.random.default_rng(5)
    for i, j in rng.integers(0, 80, size=(400, 2)):
        i, j = int(i), int(j)
        link = full.link(i, j)
        assert slim.link(i, j) == link
        assert (slim.has(link), slim.latency(link, i, j)) == (
            full.has(link),
            full.latency(link, i, j),
        )
        for nbytes in (1_000, 300_000):
            assert slim.chunk_loss_at(link, nbytes, 1500) == full.chunk_loss_at(link, nbytes, 1500)
        assert np.array_equal(slim.hears_of(i), full.hears_of(i))
    assert full.link_count() > 100 and slim.residual is full.residual  # shared, not copied
    held = sum(getattr(slim, name).nbytes for name in NOT_FOR_VERDICTS)
    assert held == 0 and sum(getattr(full, name).nbytes for name in NOT_FOR_VERDICTS) > 0
