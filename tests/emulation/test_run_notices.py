"""What a long or unfinished emulation tells its user: far from consensus, and its pace."""

from __future__ import annotations

from pathlib import Path

from airgossip.cli.display import LONG_RUN_S, ProgressDisplay
from airgossip.emulation.fleets import run_fleet
from airgossip.emulation.fleets.base import FleetProgress
from airgossip.scenario.config import Settings, load_config, read_scenario
from airgossip.scenario.wireless import scenario_path


def test_a_consensus_run_that_ends_far_from_the_average_says_so(tmp_path: Path) -> None:
    notices: list[str] = []
    settings: Settings = {
        "mode": "virtual",
        "agents": 20,
        "rounds": 2,
        "task": {"name": "consensus"},
    }
    config = load_config(None, settings, base=read_scenario(scenario_path("lte-urban")))
    results = run_fleet(config, tmp_path / "short", on_notice=notices.append)
    assert results.final is not None and results.final.relative_error is not None
    assert results.final.relative_error > 1e-2
    assert [n for n in notices if "far from consensus" in n and "round 2" in n]
    notices.clear()
    long = load_config(None, {**settings, "agents": 8, "rounds": 150},
                       base=read_scenario(scenario_path("wifi-indoor")))  # fmt: skip
    run_fleet(long, tmp_path / "long", on_notice=notices.append)
    assert not [n for n in notices if "far from consensus" in n]


def test_progress_shows_messages_a_second_the_emulated_clock_and_what_is_left() -> None:
    display = ProgressDisplay(10, gossip_only=True)
    first = FleetProgress(agents=4, rounds_total=10, registered=4, slowest_round=1,
                          messages_sent=100, emulated_s=0.5)  # fmt: skip
    assert display._pace(first) == ""  # the first report starts the clock
    assert display._started is not None
    began, _, _ = display._started
    later = FleetProgress(agents=4, rounds_total=10, registered=4, slowest_round=3,
                          messages_sent=300, emulated_s=1.5)  # fmt: skip
    display._started = (began - 2.0, 1, 100)  # as if two seconds went by: a short run
    assert display._pace(later) == ""  # its bar keeps to rounds and losses
    spent = LONG_RUN_S + 2
    display._started = (began - spent, 1, 100)  # a long run
    pace = display._pace(later)
    assert "msgs/s" in pace and "emulated 1.5 s" in pace
    left = float(pace.split("about ")[1].split(" s left")[0])
    assert 3.4 * spent <= left <= 3.6 * spent  # `spent` for 2 rounds, 7 rounds to go
