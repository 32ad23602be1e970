"""The channel model pinned to reference values: formulas, tables, bursts, fading, mobility."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.special import j0

from airgossip.emulation.channel import fading, radio
from airgossip.emulation.channel import model as channel_model
from airgossip.emulation.channel.bursts import GilbertElliottLoss
from airgossip.emulation.channel.mobility import GaussMarkov, RandomWaypoint
from airgossip.emulation.channel.model import ChannelModel, gossip_adjacency, strongly_connected
from airgossip.emulation.channel.traces import TraceError, read_mahimahi, read_mbps
from airgossip.scenario.wireless import WirelessSettings


def test_free_space_loss_reference_values() -> None:
    # 40.05 dB exactly (c = 299,792,458 m/s); the references round it to 40.0 and 46.7
    assert float(radio.free_space_loss_db(1.0, 2.4e9)) == pytest.approx(40.0, abs=0.06)
    assert float(radio.free_space_loss_db(1.0, 5.15e9)) == pytest.approx(46.7, abs=0.06)
    # 20 dB per decade in free space; the log-distance model with n = 3 adds 30
    assert float(radio.free_space_loss_db(10.0, 2.4e9)) == pytest.approx(60.05, abs=0.01)
    assert float(radio.log_distance_loss_db(100.0, 2.4e9, 3.0)) == pytest.approx(100.05, abs=0.01)


def test_38901_path_loss() -> None:
    # Before the breakpoint (38.901's base station geometry: UMi 10 m, UMa 25 m, UT 1.5 m);
    # the full table is held in test_radio_standards.py.
    f = 3.5e9
    assert float(radio.path_loss_38901_db("umi-los", 100.0, f, 10.0, 1.5)) == pytest.approx(
        32.4 + 21 * math.log10(math.hypot(100, 8.5)) + 20 * math.log10(3.5)
    )
    assert float(radio.path_loss_38901_db("uma-nlos", 500.0, f, 25.0, 1.5)) == pytest.approx(
        13.54 + 39.08 * math.log10(math.hypot(500, 23.5)) + 20 * math.log10(3.5)
    )
    # NLOS never below LOS (38.901 takes the max)
    d = np.array([2.0, 10.0, 100.0])
    assert (
        radio.path_loss_38901_db("umi-nlos", d, f) >= radio.path_loss_38901_db("umi-los", d, f)
    ).all()
    assert float(radio.los_probability("umi", 10.0)) == 1.0
    assert float(radio.los_probability("umi", 100.0)) == pytest.approx(
        18 / 100 + math.exp(-100 / 36) * (1 - 18 / 100)
    )
    with pytest.raises(ValueError, match=r"unknown 38\.901 model"):
        radio.path_loss_38901_db("rural", 1.0, f)
    # Both losses of a family at once: each model's own values, to the bit.
    d = np.geomspace(0.1, 5e4, 20_000)
    for family in ("umi", "uma", "inh"):
        los, nlos = radio.path_loss_38901_both_db(family, d, f)
        assert np.array_equal(los, radio.path_loss_38901_db(f"{family}-los", d, f))
        assert np.array_equal(nlos, radio.path_loss_38901_db(f"{family}-nlos", d, f))
    with pytest.raises(ValueError, match=r"unknown 38\.901 model"):
        radio.path_loss_38901_both_db("rural", d, f)


def test_noise_floor_and_doppler() -> None:
    assert radio.noise_floor_dbm(20e6, 7.0) == pytest.approx(-94.0, abs=0.05)
    assert float(radio.doppler_hz(1.0, 2.4e9)) == pytest.approx(8.006, abs=1e-3)


def test_80211_mcs_rate_table() -> None:
    rates = radio.wifi_mcs_rates_bps(20)[:9] / 1e6
    assert rates.tolist() == pytest.approx([6.5, 13, 19.5, 26, 39, 52, 58.5, 65, 78])
    assert radio.wifi_mcs_rates_bps(40)[0] / 1e6 == pytest.approx(13.5)
    assert radio.wifi_mcs_rates_bps(80)[0] / 1e6 == pytest.approx(29.25)
    assert radio.wifi_mcs_rates_bps(20, streams=2)[7] / 1e6 == pytest.approx(130)
    assert radio.wifi_sensitivity_dbm(20)[:3].tolist() == [-82, -79, -77]
    assert radio.wifi_sensitivity_dbm(40)[0] == pytest.approx(-79)
    table = radio.wifi_rate_table(20, 7.0)
    # received power exactly at MCS0 sensitivity, no interference: MCS0 exactly
    snr_at_sensitivity = -82.0 - radio.noise_floor_dbm(20e6, 7.0)
    assert table.index(np.array([snr_at_sensitivity]))[0] == 0
    assert table.index(np.array([snr_at_sensitivity - 0.01]))[0] == -1
    assert float(table.rate(np.array([60.0]))[0]) == pytest.approx(78e6)


def test_lte_cqi_table() -> None:
    table = radio.lte_rate_table(10e6, overhead=0.0)
    assert table.index(np.array([-6.7, -6.8, 22.7, 40.0])).tolist() == [0, -1, 14, 14]
    assert float(table.rate(np.array([22.7]))[0]) == pytest.approx(5.5547 * 10e6)
    assert float(radio.block_error_shortcut(radio.db_to_linear(-6.7))) == pytest.approx(
        0.1, abs=0.005
    )


def test_bit_and_packet_errors() -> None:
    # BPSK at gamma_b = 1: 0.5 erfc(1)
    assert float(radio.bit_error_rate(np.array(1.0), 1)) == pytest.approx(0.5 * math.erfc(1.0))
    # 16-QAM from the SER formula
    gamma, m = 20.0, 16
    e = math.erfc(math.sqrt(3 * gamma / (2 * (m - 1))))
    ser = 2 * (1 - 1 / 4) * e - (1 - 2 / 4 + 1 / 16) * e**2
    assert float(radio.bit_error_rate(np.array(gamma), 4)) == pytest.approx(ser / 4)
    assert float(radio.packet_error_rate(np.array(1e-4), 1500)) == pytest.approx(
        1 - (1 - 1e-4) ** 12000
    )
    # errors fall with SINR for every modulation
    for bits in (1, 2, 4, 6, 8):
        ber = radio.bit_error_rate(radio.db_to_linear(np.array([0.0, 10.0, 20.0, 30.0])), bits)
        assert (np.diff(ber) <= 0).all()


def test_gilbert_elliott_stationary_loss_over_1e5_draws() -> None:
    chain = GilbertElliottLoss(p=0.1, r=0.4)
    rng = np.random.default_rng(7)
    draws = rng.random(100_000)
    bad = np.empty(draws.size, dtype=bool)
    state = chain.initial(np.array([rng.random()]))
    for k, u in enumerate(draws):
        state = chain.step(state, np.array([u]))
        bad[k] = bool(state[0])
    lost = chain.loss(bad).mean()
    assert chain.stationary_loss == pytest.approx(0.2)
    assert abs(lost - 0.1 / (0.1 + 0.4)) < 0.01
    # bursts last 1 / r steps on average
    starts = np.flatnonzero(np.diff(bad.astype(int)) == 1)
    ends = np.flatnonzero(np.diff(bad.astype(int)) == -1)
    lengths = ends[ends > starts[0]][: len(starts) - 1] - starts[: len(starts) - 1]
    assert lengths.mean() == pytest.approx(1 / 0.4, rel=0.05)
    with pytest.raises(ValueError, match="p must be within"):
        GilbertElliottLoss(p=1.5, r=0.1)


def test_gilbert_elliott_from_fade_margin_and_trace() -> None:
    burst = radio.gilbert_elliott_from_fade_margin(rho=1.0, doppler=10.0, step_s=0.01)
    assert burst.bad_share == pytest.approx(1 - math.exp(-1))
    afd = (math.e - 1) / (1.0 * 10.0 * math.sqrt(2 * math.pi))
    assert burst.r == pytest.approx(0.01 / afd)
    assert burst.p / (burst.p + burst.r) == pytest.approx(burst.bad_share)
    p, r = radio.gilbert_elliott_from_trace(0.2, 0.5)
    assert p / (p + r) == pytest.approx(0.2) and 1 - p - r == pytest.approx(0.5)


@pytest.mark.parametrize("step_s", [0.005, 0.05])  # 10 Hz Doppler: rho 0.975, then -0.304
def test_fading_autocorrelation_follows_j0(step_s: float) -> None:
    assert float(fading.doppler_correlation(10.0, 0.01)) == pytest.approx(0.9037, abs=1e-4)
    rho = float(j0(2 * math.pi * 10.0 * step_s))
    rng = np.random.default_rng(3)
    links, steps = 64, 4000
    g = fading.complex_normal(rng, (links,))
    series = np.empty((steps, links), dtype=np.complex64)
    for k in range(steps):
        g = fading.ar1_step(g, np.full(links, rho), fading.complex_normal(rng, (links,)))
        series[k] = g
    lag1 = np.mean(series[1:] * np.conj(series[:-1])).real / np.mean(np.abs(series) ** 2)
    assert lag1 == pytest.approx(rho, abs=0.02)
    power = np.abs(series) ** 2
    assert power.mean() == pytest.approx(1.0, abs=0.03)  # unit mean power (Rayleigh)
    centred = power - power.mean()
    power_lag1 = np.mean(centred[1:] * centred[:-1]) / centred.var()
    assert power_lag1 == pytest.approx(rho**2, abs=0.03)  # |rho|^2 for Rayleigh power
    # Rician: mean power still 1, fewer deep fades
    rician = fading.power_gain(series, 10.0)
    assert rician.mean() == pytest.approx(1.0, abs=0.03)
    assert (rician < 0.1).mean() < (power < 0.1).mean()


def settings(**overrides: object) -> WirelessSettings:
    return WirelessSettings.model_validate(overrides)


def test_model_is_a_function_of_seed_and_step() -> None:
    s = settings(mobility={"model": "random-waypoint", "area_m": [200, 200]})
    a, b, c = ChannelModel(s, 12, 5), ChannelModel(s, 12, 5, cache_steps=2), ChannelModel(s, 12, 6)
    late = a.state(30)
    for step in (0, 7, 30):  # b replays from the start when asked for an evicted step
        b.state(40)
        assert np.array_equal(b.state(step).sinr_db, a.state(step).sinr_db)
    assert np.array_equal(b.state(30).positions, late.positions)
    assert not np.array_equal(c.state(30).sinr_db, late.sinr_db)


def test_shadowing_is_reciprocal_and_asymmetry_comes_from_the_radios() -> None:
    s = settings(fading={"model": "none"}, mobility={"area_m": [100, 100]})
    state = ChannelModel(s, 10, 1).state(3)
    off = ~np.eye(10, dtype=bool)
    assert np.allclose(state.rx_dbm[off], state.rx_dbm.T[off])
    powers = [20.0, 14.0] + [20.0] * 8
    uneven = ChannelModel(settings(tx_power_dbm=powers, mobility={"area_m": [100, 100]}), 10, 1)
    st = uneven.state(3)
    assert st.rx_dbm[0, 1] - st.rx_dbm[1, 0] == pytest.approx(6.0, abs=1e-3)


def test_links_exist_while_received_power_reaches_mcs0_sensitivity() -> None:
    model = ChannelModel(settings(mobility={"area_m": [400, 400]}), 20, 2)
    state = model.state(0)
    off = ~np.eye(20, dtype=bool)
    assert np.array_equal(state.exists[off], (state.rx_dbm >= model.sensitivity_dbm[None, :])[off])
    assert model.sensitivity_dbm == pytest.approx(np.full(20, -82.0), abs=1e-4)
    assert 0 < state.exists.sum() < 20 * 19  # some links in range, some not
    assert (state.rate_bps[state.bad] == 0).all()  # fading-driven bursts: below MCS0
    assert state.bad.any() and (state.rate_bps[state.exists & ~state.bad] >= 6.5e6).all()


def test_interference_from_concurrent_transmitters_lowers_sinr() -> None:
    base = {"mobility": {"area_m": [300, 300]}, "fading": {"model": "none"}}
    quiet = ChannelModel(settings(activity=0.0, **base), 30, 4).state(0)
    busy = ChannelModel(settings(activity=0.5, **base), 30, 4).state(0)
    links = quiet.exists
    assert (busy.sinr_db[links] <= quiet.sinr_db[links] + 1e-4).all()
    assert (busy.sinr_db[links] < quiet.sinr_db[links] - 1.0).any()


def test_gilbert_elliott_bursts_in_the_model() -> None:
    s = settings(
        burst={"model": "gilbert-elliott", "p": 0.05, "r": 0.2},
        mobility={"area_m": [30, 30]}, fading={"model": "none"},
    )  # fmt: skip
    model = ChannelModel(s, 6, 0)
    bad = np.stack([model.state(k).bad for k in range(400)])
    off = ~np.eye(6, dtype=bool)
    assert bad[:, off].mean() == pytest.approx(0.05 / 0.25, abs=0.03)


def test_gossip_graph_is_strongly_connected_when_the_radio_allows() -> None:
    s = settings(max_out_degree=2, mobility={"area_m": [300, 300]})
    for step in (0, 10):
        state = ChannelModel(s, 40, 3).state(step)
        radio_ok, _ = strongly_connected(state.exists)
        adjacency = gossip_adjacency(state, 2)
        assert not (adjacency & ~state.exists).any()  # only links that exist
        assert strongly_connected(adjacency)[0] == radio_ok
    far = settings(
        mobility={"model": "static", "positions": [[0, 0], [5, 0], [5000, 0], [5005, 0]]}
    )
    state = ChannelModel(far, 4, 0).state(0)
    connected, components = strongly_connected(gossip_adjacency(state, 2))
    assert not connected and components == 2


def test_random_waypoint_and_gauss_markov_stay_in_the_area() -> None:
    rng = np.random.default_rng(0)
    rwp = RandomWaypoint((100.0, 50.0), 1.0, 3.0, pause_s=1.0)
    state = rwp.initial(30, rng)
    speeds = []
    for _ in range(500):
        state = rwp.step(state, 0.5, rng)
        assert (state.positions >= 0).all() and (state.positions <= [100.0, 50.0]).all()
        speeds.append(state.speeds)
    moving = np.concatenate(speeds)
    moving = moving[moving > 0]
    assert moving.min() >= 1.0 - 1e-9 and moving.max() <= 3.0 + 1e-9
    with pytest.raises(ValueError, match="minimum speed > 0"):
        RandomWaypoint((10.0, 10.0), 0.0, 1.0)
    gm = GaussMarkov((80.0, 80.0), mean_speed=2.0, speed_sigma=0.5)
    state = gm.initial(30, rng)
    for _ in range(500):
        state = gm.step(state, 0.5, rng)
        assert (state.positions >= 0).all() and (state.positions <= 80.0).all()
    assert np.mean(state.speeds) == pytest.approx(2.0, abs=0.6)


def test_traces(tmp_path: Path) -> None:
    one = tmp_path / "12mbps.mahi"
    one.write_text("1\n")
    assert read_mahimahi(one).mean_rate(0.0, 1.0) == pytest.approx(12e6)
    burst = tmp_path / "burst.mahi"
    burst.write_text("".join(f"{t}\n" for t in (1, 1, 1, 1, 1000)))  # 4 packets at once, then 1
    trace = read_mahimahi(burst)
    assert trace.mean_rate(0.0, 1.0) == pytest.approx(5 * 1500 * 8)
    cooked = tmp_path / "cooked.txt"
    cooked.write_text("# time Mbps\n0 8\n1 16\n2 4\n")
    rates = read_mbps(cooked)
    assert rates.rate_at(0.5) == 8e6 and rates.rate_at(1.5) == 16e6 and rates.rate_at(2.5) == 4e6
    assert rates.rate_at(3.5) == 8e6  # loops after the last row plus the mean gap
    assert rates.mean_rate(0.5, 1.0) == pytest.approx(12e6)
    bad = tmp_path / "bad.txt"
    bad.write_text("0 8\n1 fast\n")
    with pytest.raises(TraceError, match=r"bad.txt:2: expected 'time_s Mbps'"):
        read_mbps(bad)
    backwards = tmp_path / "back.mahi"
    backwards.write_text("5\n3\n")
    with pytest.raises(TraceError, match=r"back\.mahi:2"):
        read_mahimahi(backwards)


@pytest.mark.parametrize(
    "overrides",
    [
        {"radio": "lte", "path_loss": {"model": "uma"}, "access": "scheduled", "activity": 0.2},
        {"fading": {"model": "rayleigh"}, "activity": 0.3},  # csma: hidden-node interference
        {"burst": {"model": "gilbert-elliott", "p": 0.1, "r": 0.3}},
    ],
)
def test_a_step_computed_by_row_blocks_equals_the_whole(
    overrides: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = settings(mobility={"model": "gauss-markov", "area_m": [300, 300]}, **overrides)
    whole = [ChannelModel(s, 23, 4).state(k) for k in range(3)]
    monkeypatch.setattr(channel_model, "BLOCK_ELEMENTS", 23 * 3 + 5)  # 3 rows, a short last
    blocks = [ChannelModel(s, 23, 4).state(k) for k in range(3)]
    for a, b in zip(whole, blocks, strict=True):
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype and np.array_equal(x, y), f.name
            else:
                assert x == y, f.name
