"""The wireless link shaper, shared air, per-link figures, scenarios and their errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import generate_latest

from airgossip.common.seeds import keyed_uniform
from airgossip.edge.observability.metrics import AgentMetrics
from airgossip.emulation.channel.model import ChannelModel
from airgossip.emulation.channel.radio import WIFI_DATA_SUBCARRIERS
from airgossip.emulation.fleets import run_fleet
from airgossip.emulation.networks.shaper import WirelessLinkShaper
from airgossip.emulation.networks.wireless import LAMBDA2_DENSE_LIMIT, WirelessLinks, WirelessRun
from airgossip.scenario.config import ConfigError, load_config, read_scenario
from airgossip.scenario.wireless import (
    WIFI_BANDWIDTHS_MHZ,
    WirelessSettings,
    preset_names,
    scenario_path,
)
from tests.support.prometheus import promtool_check


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def trace_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rate.txt"
    path.write_text(text)
    return path


def link_settings(tmp_path: Path, trace: str = "0 8\n1 8\n", **overrides: Any) -> WirelessSettings:
    """Static nodes, no fading or bursts, every link's rate from a two-column trace."""
    data: dict[str, Any] = {
        "latency_ms": 1.0, "jitter_ms": 0.0, "activity": 0.0,
        "fading": {"model": "none"}, "burst": {"model": "none"},
        "mobility": {"model": "static", "positions": [[0, 0], [5, 0], [0, 5], [5, 5]]},
        "traces": [{"file": str(trace_file(tmp_path, trace)), "format": "mbps"}],
    }  # fmt: skip
    data.update(overrides)
    return WirelessSettings.model_validate(data)


def shaper_for(
    settings: WirelessSettings, clock: Clock, n: int = 4, **kw: Any
) -> WirelessLinkShaper:
    model = ChannelModel(settings, n, seed=1)
    return WirelessLinkShaper(model, [f"agent-{i}" for i in range(n)], clock, **kw)


def test_a_message_takes_its_size_over_the_rate(tmp_path: Path) -> None:
    clock = Clock()
    shaper = shaper_for(link_settings(tmp_path), clock)
    verdict = shaper.plan("agent-0", "agent-1", 1, 0, 1_000_000)
    latency = 1e-3 + 5.0 / 299_792_458
    assert not verdict.drop
    assert verdict.delay_s == pytest.approx(latency + 8e6 / 8e6, rel=1e-6)


def test_rate_change_mid_transfer_is_honoured(tmp_path: Path) -> None:
    clock = Clock()
    clock.now = 0.5
    shaper = shaper_for(link_settings(tmp_path, "0 8\n1 16\n"), clock)  # 8 Mb/s, then 16
    verdict = shaper.plan("agent-0", "agent-1", 1, 0, 1_000_000)
    start = 0.5 + 1e-3 + 5.0 / 299_792_458
    first = 8e6 * (1.0 - start)  # bits sent at 8 Mb/s before the rate changes at t = 1 s
    end = 1.0 + (8e6 - first) / 16e6
    assert verdict.delay_s == pytest.approx(end - 0.5, rel=1e-6)
    clock.now = 0.0
    slow = shaper_for(link_settings(tmp_path, "0 8\n1 8\n"), clock).plan(
        "agent-0", "agent-1", 1, 0, 1_000_000
    )
    assert verdict.delay_s < slow.delay_s


def test_loss_is_decided_per_chunk(tmp_path: Path) -> None:
    settings = link_settings(
        tmp_path, chunk_bytes=1024, shared_air=False,
        burst={"model": "gilbert-elliott", "p": 0.0, "r": 1.0, "loss_good": 0.3},
    )  # fmt: skip
    clock = Clock()
    shaper = shaper_for(settings, clock)
    one = np.mean([shaper.plan("agent-0", "agent-1", 1, k, 1000).drop for k in range(3000)])
    four = np.mean([shaper.plan("agent-0", "agent-2", 1, k, 4096).drop for k in range(3000)])
    assert one == pytest.approx(0.3, abs=0.03)
    assert four == pytest.approx(1 - 0.7**4, abs=0.03)


def test_same_seed_same_verdicts(tmp_path: Path) -> None:
    settings = WirelessSettings.model_validate(
        {"mobility": {"model": "random-waypoint", "area_m": [150, 150]}, "jitter_ms": 2.0}
    )
    runs = []
    for seed in (3, 3, 4):
        clock = Clock()
        model = ChannelModel(settings, 6, seed=seed)
        shaper = WirelessLinkShaper(model, [f"agent-{i}" for i in range(6)], clock, journal=True)
        for k in range(300):
            clock.now = k * 0.37
            shaper.plan(f"agent-{k % 6}", f"agent-{(k * 7 + 1) % 6}", k, k // 6, 20_000)
        assert shaper.journal is not None
        runs.append([(e.drop, round(e.delay_s, 12)) for e in shaper.journal])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert any(drop for drop, _ in runs[0]) and not all(drop for drop, _ in runs[0])
    assert keyed_uniform(1, 2, 3) == keyed_uniform(1, 2, 3) != keyed_uniform(1, 2, 4)


def test_transfers_in_one_carrier_sense_domain_share_the_air(tmp_path: Path) -> None:
    clock = Clock()
    shaper = shaper_for(link_settings(tmp_path), clock)
    first = shaper.plan("agent-0", "agent-1", 1, 0, 1_000_000)
    second = shaper.plan("agent-2", "agent-3", 1, 0, 1_000_000)
    assert first.delay_s == pytest.approx(1.0, abs=0.01)
    assert second.delay_s == pytest.approx(2.0, abs=0.02)  # waits for the air, then 1 s
    far = link_settings(
        tmp_path, mobility={"model": "static", "positions": [[0, 0], [5, 0], [3000, 0], [3005, 0]]}
    )
    apart = shaper_for(far, clock)
    a = apart.plan("agent-0", "agent-1", 1, 0, 1_000_000)
    b = apart.plan("agent-2", "agent-3", 1, 0, 1_000_000)
    assert a.delay_s == pytest.approx(b.delay_s, rel=1e-6)  # out of each other's hearing
    alone = shaper_for(link_settings(tmp_path, shared_air=False), clock)
    alone.plan("agent-0", "agent-1", 1, 0, 1_000_000)
    assert alone.plan("agent-2", "agent-3", 1, 0, 1_000_000).delay_s == pytest.approx(1.0, abs=0.01)


def test_messages_to_a_node_out_of_range_are_lost(tmp_path: Path) -> None:
    settings = link_settings(
        tmp_path, mobility={"model": "static", "positions": [[0, 0], [5, 0], [9000, 0], [5, 5]]}
    )
    shaper = shaper_for(settings, Clock())
    verdict = shaper.plan("agent-0", "agent-2", 1, 0, 10_000)
    assert verdict.drop
    assert verdict.delay_s == pytest.approx(1e-3 + 9000 / 299_792_458 + 0.2, rel=1e-6)


def test_link_figures_for_the_metrics_layer(tmp_path: Path) -> None:
    clock = Clock()
    shaper = shaper_for(link_settings(tmp_path), clock)
    for k in range(3):
        shaper.plan("agent-0", "agent-1", k, k, 50_000)
    records = shaper.snapshot()
    assert [(r.sender, r.receiver, r.messages, r.bytes) for r in records] == [
        ("agent-0", "agent-1", 3, 150_000)
    ]
    r = records[0]
    assert r.exists and not r.bad and r.goodput_bps == pytest.approx(8e6) and r.drops == 0
    assert r.mean_delay_s > 0.05 and np.isfinite(r.sinr_db)
    every = shaper.snapshot(active_only=False)
    assert len(every) == 12  # all directed links among 4 close nodes


def test_an_agent_exports_the_radio_state_of_its_out_links(tmp_path: Path) -> None:
    ids = [f"agent-{i}" for i in range(4)]
    links = WirelessLinks(WirelessRun(link_settings(tmp_path), ids, seed=1, clock=lambda: 0.5))
    figures = links.link_figures(0)
    assert [f.peer for f in figures] == ["agent-1", "agent-2", "agent-3"]  # 4 close nodes
    state = links.run.model.at(0.5)
    for f in figures:
        j = ids.index(f.peer)
        assert f.in_range and not f.burst_bad
        assert f.sinr_db == pytest.approx(float(state.sinr_db[0, j]))
        assert f.rate_bps == pytest.approx(float(state.rate_bps[0, j]))
    metrics = AgentMetrics("agent-0")
    metrics.observe_links(figures)
    sample = metrics.registry.get_sample_value
    assert sample("airgossip_link_in_range", {"peer": "agent-2"}) == 1.0
    assert sample("airgossip_link_sinr_decibels", {"peer": "agent-3"}) == pytest.approx(
        figures[2].sinr_db
    )
    assert sample("airgossip_link_burst_bad", {"peer": "agent-1"}) == 0.0
    # Bytes/s, Prometheus's base unit: the PHY's bit rate over 8.
    assert sample("airgossip_link_rate_bytes_per_second", {"peer": "agent-2"}) == pytest.approx(
        figures[1].rate_bps / 8
    )
    promtool_check(generate_latest(metrics.registry).decode())


def test_presets_load_and_have_links() -> None:
    names = preset_names()
    assert {"wifi-indoor", "wifi-outdoor-mobile", "lte-urban"} <= set(names)
    for name in names:
        config = load_config(None, {"agents": 12}, base=read_scenario(scenario_path(name)))
        assert config.wireless is not None and config.wireless.name == name
        state = ChannelModel(config.wireless, 12, 0).state(0)
        assert state.exists.sum() >= 12, name


@pytest.mark.parametrize(
    ("wireless", "message"),
    [
        (
            {"path_loss": {"model": "hata"}},
            "unknown path loss model 'hata'; choose one of: log-distance",
        ),
        ({"mobility": {"model": "random-waypoint", "min_speed_mps": 0}}, "min_speed_mps > 0"),
        ({"bandwidth_mhz": 30}, "wifi bandwidth_mhz must be one of 20, 40, 80, 160, got 30"),
        ({"colour": 1}, "unknown setting 'wireless.colour'"),
        ({"fading": {"model": "nakagami"}}, "wireless.fading.model"),
        ({"step_s": 0}, "wireless.step_s"),
        ({"burst": {"model": "gilbert-elliott", "p": 0, "r": 0}}, "p + r > 0"),
    ],
)
def test_bad_scenarios_get_one_line_errors(wireless: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_config(None, {"wireless": wireless})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"mode": "virtual"}, "mode 'virtual' runs a network that changes with time"),
        (
            {"agents": 4, "wireless": {"mobility": {"positions": [[0, 0], [1, 1]]}}},
            "positions lists 2 positions for 4 agents",
        ),
        (
            {"agents": 3, "wireless": {"tx_power_dbm": [20, 20]}},
            "tx_power_dbm lists 2 values for 3",
        ),
        ({"wireless": {"traces": [{"file": "/nonexistent/rate.txt"}]}}, "cannot read trace"),
    ],
)
def test_scenarios_that_cannot_run_fail_before_anything_starts(
    tmp_path: Path, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        run_fleet(load_config(None, {"mode": "virtual", **settings}), tmp_path)
    assert not (tmp_path / "results.json").exists()


class FollowedAgent:
    """What ``WirelessLinks.follow`` needs of an agent: an id and its assignment."""

    def __init__(self, agent_id: str, assignment: Any) -> None:
        self.agent_id = agent_id
        self.assignment = assignment

    def set_assignment(self, assignment: Any) -> None:
        self.assignment = assignment


def test_a_followed_agent_takes_a_peers_new_address_from_the_coordinator(
    tmp_path: Path,
) -> None:
    """A peer restarted elsewhere (a container back at another address) re-registers; the
    coordinator's next assignment carries the address, and the wireless graph keeps it."""
    import threading
    import time

    from airgossip.common.topology import Assignment

    ids = [f"agent-{i}" for i in range(4)]
    run = WirelessRun(link_settings(tmp_path), ids, seed=1, clock=Clock())
    links = WirelessLinks(run)
    first = {a: f"10.0.0.{i}:7000" for i, a in enumerate(ids)}
    agent = FollowedAgent("agent-0", Assignment(1, first, ()))
    stop = threading.Event()
    try:
        links.follow(agent, stop)  # type: ignore[arg-type]
        installed = agent.assignment
        assert installed.peers["agent-2"] == "10.0.0.2:7000"
        agent.set_assignment(Assignment(2, {**first, "agent-2": "10.0.0.9:7000"}, ()))
        deadline = time.monotonic() + 10
        while agent.assignment.schedule == () and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.assignment.schedule != ()  # the wireless graph, installed again
        assert agent.assignment.peers["agent-2"] == "10.0.0.9:7000"
        assert "agent-0" not in agent.assignment.peers
    finally:
        stop.set()


def test_a_large_wireless_fleet_gets_lambda2_and_the_sparse_solve_agrees() -> None:
    """Every wireless fleet reports its first graph's |lambda2| (dense up to
    LAMBDA2_DENSE_LIMIT agents, sparse above: 300 agents are solved sparsely), and it agrees
    with the dense solve on such a graph."""
    from airgossip.common.topology import (
        mixing_matrices,
        second_largest_eigenvalue,
        sparse_mixing_matrices,
    )
    from airgossip.emulation.networks import network_for

    config = load_config(None, {"mode": "virtual", "agents": 300, "rounds": 2,
                                "task": {"name": "consensus"}},
                         base=read_scenario(scenario_path("lte-urban")))  # fmt: skip
    network = network_for(config)
    assert config.agents > LAMBDA2_DENSE_LIMIT
    graph = network.first_graph()
    lambda2 = network.resolved(graph).lambda2
    assert lambda2 is not None
    assert lambda2 == pytest.approx(second_largest_eigenvalue(mixing_matrices(graph)), abs=1e-6)
    assert 0.0 < lambda2 < 1.0
    assert second_largest_eigenvalue(sparse_mixing_matrices(graph)) == pytest.approx(
        lambda2, abs=1e-6
    )


def test_the_settings_take_the_wifi_widths_the_radio_model_knows() -> None:
    assert tuple(WIFI_DATA_SUBCARRIERS) == WIFI_BANDWIDTHS_MHZ
    with pytest.raises(ValueError, match="wifi bandwidth_mhz must be one of 20, 40, 80, 160"):
        WirelessSettings(radio="wifi", bandwidth_mhz=30)
