"""The shaper's quick paths give its reference answers: a push's messages decided at once,
the channel's next step computed ahead."""

from __future__ import annotations

import numpy as np

from emulation.channel.model import ChannelModel
from emulation.networks.shaper import WirelessLinkShaper
from emulation.scenario import WirelessSettings


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


def test_a_step_computed_ahead_is_the_step_computed_when_asked() -> None:
    settings = WirelessSettings.model_validate(
        {"mobility": {"model": "gauss-markov", "area_m": [400, 400]}, "activity": 0.3,
         "fading": {"model": "rayleigh"}, "step_s": 0.1}
    )  # fmt: skip
    ahead, asked = ChannelModel(settings, 60, 9), ChannelModel(settings, 60, 9)
    for step in range(6):
        kept = ahead.state(step)
        ahead.prefetch(step + 1)
        assert ahead.state(step) is kept  # a kept step while the next one is computed
        assert ahead._ahead is not None
        ahead._ahead.join(timeout=60)
        assert ahead._cursor == step + 1  # computed in the background, not when asked
        mine, reference = ahead.state(step + 1), asked.state(step + 1)
        for name in ("rx_dbm", "sinr_db", "rate_bps", "per", "goodput_bps", "hears", "bad"):
            assert np.array_equal(getattr(mine, name), getattr(reference, name)), name
    started = ahead._ahead
    ahead.prefetch(3)  # not the next step: nothing is started
    assert ahead._ahead is started and ahead._cursor == 6
