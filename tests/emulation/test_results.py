"""Results of every kind of run: the defaults of emulated and real links, the plot's panels."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from airgossip.scenario.config import EMULATED_LOSS, load_config
from airgossip.scenario.results import (
    SCHEMA_VERSION,
    FinalFigures,
    RoundFigures,
    RunResults,
    plot_results,
)


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


def test_results_name_their_times_and_files_of_schema_1_are_still_read(tmp_path: Path) -> None:
    """Schema 2 names each round's time ``train_wall_s`` (the agents' rounds) beside the
    run's ``total_wall_s`` (start-up included); a schema-1 file, whose rounds said
    ``wall_s``, reads as the same figures."""
    rows = [RoundFigures(round=1, train_wall_s=0.5), RoundFigures(round=2, train_wall_s=1.25)]
    final = FinalFigures(round=2, train_wall_s=1.25, complete=True)
    written = tmp_path / "results.json"
    RunResults(config={}, rounds=rows, final=final, total_wall_s=9.5).write(written)
    data = json.loads(written.read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 2
    assert data["final"]["train_wall_s"] == 1.25 and "wall_s" not in data["final"]
    assert data["total_wall_s"] == 9.5
    old = json.loads(written.read_text())
    del old["schema_version"]
    for row in [*old["rounds"], old["final"]]:
        row["wall_s"] = row.pop("train_wall_s")
    (tmp_path / "old.json").write_text(json.dumps(old))
    read = RunResults.read(tmp_path / "old.json")
    assert read.schema_version == 1
    assert [r.train_wall_s for r in read.rounds] == [0.5, 1.25]
    assert read.final.train_wall_s == 1.25 and read.total_wall_s == 9.5
