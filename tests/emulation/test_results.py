"""Results of every kind of run: the defaults of emulated and real links, the plot's panels."""

from __future__ import annotations

import struct
from pathlib import Path

from emulation.config import EMULATED_LOSS, load_config
from emulation.results import FinalFigures, RoundFigures, RunResults, plot_results


def test_local_runs_emulate_a_lossy_network_and_devices_emulate_nothing(tmp_path: Path) -> None:
    local = load_config(None, {})
    assert local.network.loss == EMULATED_LOSS == 0.1 and local.emulates_links
    devices = load_config(None, {}, real_links=True)
    assert devices.network.loss == 0.0 and not devices.emulates_links
    scenario = tmp_path / "s.toml"
    scenario.write_text("[network]\nlatency_ms = 5\n")
    asked = load_config(scenario, real_links=True)  # a scenario that asks gets what it asks
    assert asked.network.loss == 0.0 and asked.network.latency_ms == 5 and asked.emulates_links
    scenario.write_text("[network]\nloss = 0.2\n")
    assert load_config(scenario, real_links=True).network.loss == 0.2


def png_width(path: Path) -> int:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return int(struct.unpack(">I", header[16:20])[0])


def test_wireless_plots_show_drop_rate_and_link_counts(tmp_path: Path) -> None:
    rows = [
        RoundFigures(round=r, mean_accuracy=0.5, min_accuracy=0.4, max_accuracy=0.6,
                     consensus_distance=1 / r, drop_rate=0.1, radio_links=30.0, gossip_links=12.0)
        for r in range(1, 11)
    ]  # fmt: skip
    plain = [r.model_copy(update={"drop_rate": None, "radio_links": None, "gossip_links": None})
             for r in rows]  # fmt: skip
    final = FinalFigures(round=10)
    plot_results(tmp_path / "wireless.png", RunResults(config={}, rounds=rows, final=final), "w")
    plot_results(tmp_path / "static.png", RunResults(config={}, rounds=plain, final=final), "s")
    # A third panel (drop rate, radio and gossip links) only where the rounds hold them.
    assert png_width(tmp_path / "wireless.png") > 1.3 * png_width(tmp_path / "static.png")
