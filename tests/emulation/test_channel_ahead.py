"""A dense model's steps computed ahead in a worker process are the steps computed here.

The worker is a real process (``python -m airgossip.emulation.channel.worker``) holding its own copy
of the model; the tests lower :data:`~airgossip.emulation.channel.model.AHEAD_MIN_NODES` so that a
small model (fast to compute) uses it.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from airgossip.emulation.channel import model as channel_model
from airgossip.emulation.channel.model import ChannelModel
from airgossip.emulation.channel.state import LinkState
from airgossip.scenario.config import read_scenario
from airgossip.scenario.wireless import WirelessSettings, scenario_path

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="the worker is used with a second CPU only"
)

N = 60


def preset(name: str) -> WirelessSettings:
    wireless = read_scenario(scenario_path(name))["wireless"]
    return WirelessSettings.model_validate(wireless)


def assert_same(a: LinkState, b: LinkState) -> None:
    for f in dataclasses.fields(LinkState):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), f.name
        else:
            assert x == y, f.name


@pytest.fixture
def small_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel_model, "AHEAD_MIN_NODES", N)


@pytest.mark.parametrize("name", ["lte-urban", "wifi-indoor", "wifi-outdoor-mobile"])
def test_steps_from_the_worker_are_the_steps_computed_here(name: str, small_ahead: None) -> None:
    here, ahead = ChannelModel(preset(name), N, 3), ChannelModel(preset(name), N, 3)
    assert not here._ahead and ahead.compute_ahead()
    try:
        for step in range(6):
            assert_same(ahead.state(step), here.state(step))
        # Out of order: a later step computed on demand, then an evicted one replayed.
        assert_same(ahead.state(9), here.state(9))
        fresh = ChannelModel(preset(name), N, 3)
        assert_same(ahead.state(2), fresh.state(2))
        state = ahead.state(3)
        state.sinr_db[0, 1] = 0.0  # the caller's arrays are its own to write (copy-on-write)
        assert_same(ahead.state(10), here.state(10))
    finally:
        ahead.close()


def test_a_model_whose_worker_dies_computes_its_steps_itself(small_ahead: None) -> None:
    here, ahead = ChannelModel(preset("lte-urban"), N, 8), ChannelModel(preset("lte-urban"), N, 8)
    assert ahead.compute_ahead()
    assert ahead._ahead is not None
    assert_same(ahead.state(0), here.state(0))
    assert_same(ahead.state(1), here.state(1))
    ahead._ahead._process.kill()
    for step in (2, 3):  # replayed from step 0 here, once
        assert_same(ahead.state(step), here.state(step))
    assert ahead._ahead is None


def test_small_models_and_close_leave_no_worker(small_ahead: None) -> None:
    small = ChannelModel(preset("lte-urban"), N - 1, 1)
    assert not small.compute_ahead() and small._ahead is None
    model = ChannelModel(preset("lte-urban"), N, 1)
    assert model.compute_ahead()
    assert model._ahead is not None
    process = model._ahead._process
    model.close()
    assert process.poll() is not None and model._ahead is None
    assert model.state(1).step == 1  # computed here again
