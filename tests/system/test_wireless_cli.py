"""`airgossip run --scenario`, `--record` and `airgossip links`, as users call them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import airgossip, assert_one_line_error, cli


def test_run_a_preset_on_the_virtual_clock(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = cli(
        "run", "--scenario", "wifi-indoor", "--mode", "virtual", "--agents", "6",
        "--rounds", "8", "--task", "consensus", "--record", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wireless wifi-indoor" in result.stdout and "wireless links" in result.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["wireless"]["name"] == "wifi-indoor"
    assert results["config"]["wireless"]["record"] is True
    assert all("radio_links" in row and "drop_rate" in row for row in results["rounds"])
    assert (out / "links.jsonl").stat().st_size > 0 and (out / "messages.jsonl").exists()
    assert (out / "results.png").exists()


def test_a_scenario_file_with_a_trace_beside_it(tmp_path: Path) -> None:
    (tmp_path / "rate.txt").write_text("0 5\n1 20\n")
    scenario = tmp_path / "mine.toml"
    scenario.write_text(
        'agents = 4\nrounds = 5\nmode = "virtual"\n[task]\nname = "consensus"\n'
        '[wireless]\nname = "mine"\n[wireless.mobility]\narea_m = [20, 20]\n'
        '[[wireless.traces]]\nfile = "rate.txt"\n'
    )
    out = tmp_path / "out"
    result = cli("run", "--scenario", str(scenario), "--rounds", "3", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["final"]["round"] == 3 and results["config"]["wireless"]["name"] == "mine"


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--scenario", "wifi-moon"], ["unknown scenario 'wifi-moon'", "lte-urban", ".toml"]),
        (["--scenario", "nope.toml"], ["scenario file nope.toml does not exist"]),
        (["--record"], ["--record needs a wireless scenario"]),
        (["--mode", "virtual"], ["mode 'virtual' runs a network that changes with time"]),
    ],
)
def test_bad_wireless_flags(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    assert_one_line_error(cli("run", "--out", str(tmp_path / "o"), *args), *fragments)


def test_bad_wireless_table_in_a_scenario_file(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text('[wireless]\nradio = "wimax"\n')
    assert_one_line_error(
        cli("run", "--scenario", str(scenario)), "wireless.radio", "'wifi'", "'lte'"
    )


def test_links_prints_the_table_and_draws_the_topology(tmp_path: Path) -> None:
    png = tmp_path / "links.png"
    result = cli("links", "wifi-outdoor-mobile", "--at", "12.5", "--png", str(png), "--limit", "0")
    assert result.returncode == 0, result.stderr
    assert "t = 12.5 s (step 25)" in result.stdout
    assert "radio links" in result.stdout and "gossip" in result.stdout
    assert png.stat().st_size > 20_000
    assert_one_line_error(cli("links", "wifi-moon"), "unknown scenario 'wifi-moon'")
    assert_one_line_error(cli("links", "lte-urban", "--at", "-1"), "--at must be >= 0")


@pytest.mark.slow
def test_digits_over_wifi_outdoor_mobile_with_16_agent_processes(tmp_path: Path) -> None:
    """The issue's acceptance run: 16 OS processes, real gRPC, mobility changes the graph."""
    out = tmp_path / "run"
    result = airgossip(
        "run", "--scenario", "wifi-outdoor-mobile", "--agents", "16", "--out", str(out),
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["final"]["mean_accuracy"] >= 0.85
    assert results["wireless"]["graph_epochs"] > 2  # the gossip graph changed under mobility
    rows = results["rounds"]
    assert all(row.get("radio_links") and row.get("gossip_links") for row in rows)
    assert any(row["drop_rate"] for row in rows[1:] if row["drop_rate"] is not None)
