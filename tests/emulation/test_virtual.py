"""The virtual-clock backend: the same agents on discrete events, deterministic, fast."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from airgossip.emulation.fleets import run_fleet
from airgossip.scenario.config import load_config, read_scenario
from airgossip.scenario.wireless import scenario_path


def run(tmp_path: Path, preset: str, **settings: Any) -> dict[str, Any]:
    config = load_config(
        None, {"mode": "virtual", **settings}, base=read_scenario(scenario_path(preset))
    )
    return run_fleet(config, tmp_path).to_json()


def strip(results: dict[str, Any]) -> list[dict[str, Any]]:
    return results["rounds"]


def test_consensus_over_a_static_wireless_office_is_exact(tmp_path: Path) -> None:
    results = run(tmp_path, "wifi-indoor", agents=8, rounds=150, task={"name": "consensus"})
    final = results["final"]
    assert final["relative_error"] < 1e-6
    assert final["messages_dropped"] > 0  # bursts happened, and pushed mass arrived later
    assert results["config"]["topology"] == "wireless:wifi-indoor"
    assert results["wireless"]["graph_epochs"] >= 1


def test_same_seed_same_run_and_a_different_seed_differs(tmp_path: Path) -> None:
    settings = {
        "agents": 10,
        "rounds": 15,
        "task": {"name": "consensus"},
        "wireless": {"record": True},
    }
    a = run(tmp_path / "a", "wifi-outdoor-mobile", **settings)
    b = run(tmp_path / "b", "wifi-outdoor-mobile", **settings)
    c = run(tmp_path / "c", "wifi-outdoor-mobile", seed=1, **settings)
    assert strip(a) == strip(b)  # wall_s is virtual time: identical too
    assert strip(a) != strip(c)
    journal = [(tmp_path / d / "messages.jsonl").read_text() for d in ("a", "b", "c")]
    assert journal[0] == journal[1] != journal[2]
    lines = journal[0].splitlines()
    assert len(lines) == a["final"]["messages_sent"]
    entry = json.loads(lines[0])
    assert {"sender", "receiver", "round", "index", "start_s", "drop", "delay_s"} <= set(entry)


def test_the_graph_changes_under_mobility_and_results_record_it(tmp_path: Path) -> None:
    results = run(
        tmp_path, "wifi-outdoor-mobile", agents=12, rounds=60, task={"name": "consensus"},
        wireless={"record": True, "graph_interval_s": 1.0},
    )  # fmt: skip
    rows = results["rounds"]
    assert all({"radio_links", "gossip_links", "drop_rate"} <= set(r) for r in rows)
    assert len({r["gossip_links"] for r in rows}) > 1 or len({r["radio_links"] for r in rows}) > 1
    assert results["wireless"]["graph_epochs"] > 2
    drops = [r["drop_rate"] for r in rows[1:] if r["drop_rate"] is not None]
    assert drops and all(0.0 <= d <= 1.0 for d in drops)
    assert results["final"]["drop_rate"] == pytest.approx(
        results["final"]["messages_dropped"] / results["final"]["messages_sent"]
    )
    log = (tmp_path / "links.jsonl").read_text().splitlines()
    assert len(log) == results["wireless"]["links_log_steps"] >= 2
    step = json.loads(log[-1])
    assert len(step["positions"]) == 12 and len(step["links"]["from"]) == len(
        step["links"]["sinr_db"]
    )


def test_nothing_sleeps_a_slow_network_runs_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    results = run(
        tmp_path, "lte-urban", agents=8, rounds=6,
        task={"name": "consensus", "dim": 100_000},  # 800 kB messages over LTE links
        wireless={"mobility": {"area_m": [300, 300]}},
    )  # fmt: skip
    assert not slept
    assert results["wireless"]["emulated_s"] > 3.0  # seconds of network time, none waited
    assert results["final"]["round"] == 6


def test_digits_learns_while_agents_move(tmp_path: Path) -> None:
    results = run(tmp_path, "wifi-outdoor-mobile", agents=16, rounds=40)
    assert results["final"]["mean_accuracy"] >= 0.85
    assert results["wireless"]["graph_epochs"] > 1


def test_the_progress_and_the_summary_count_the_same_messages(tmp_path: Path) -> None:
    """A push still in flight when its sender reported its last round is counted by neither
    the last progress nor the summary (both read the agents' records): once, the progress
    counted it and the two disagreed by one."""
    config = load_config(
        None,
        {"mode": "virtual", "agents": 8, "rounds": 5, "seed": 1, "wait_timeout_s": 0.01},
        base=read_scenario(scenario_path("lte-urban")),
    )
    seen: list[Any] = []
    results = run_fleet(config, tmp_path, on_progress=seen.append)
    last, final = seen[-1], results.final
    assert (last.slowest_round, last.messages_sent, last.messages_dropped) == (
        final.round, final.messages_sent, final.messages_dropped,
    )  # fmt: skip
