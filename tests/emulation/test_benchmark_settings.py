"""The benchmark's settings files load over their preset and hold what their rows say."""

from __future__ import annotations

from pathlib import Path

from airgossip.edge.tasks.digits import DigitsOptions
from airgossip.scenario.config import load_config, read_scenario
from airgossip.scenario.wireless import scenario_path

ROOT = Path(__file__).resolve().parents[2]


def test_the_digits_fleet_settings_load_over_lte_urban() -> None:
    path = ROOT / "benchmarks" / "configs" / "digits-fleet.toml"
    base = read_scenario(scenario_path("lte-urban"))
    config = load_config(
        path,
        {"mode": "virtual", "agents": 1000, "rounds": 40, "task": {"name": "digits"}},
        base=base,
    )
    # The row's goal text names these; the preset's gossip graph is left as it is.
    assert config.task.name == "digits"
    assert config.wait_timeout_s == 10.0 and config.eval_every == 10
    assert config.wireless is not None and config.wireless.max_out_degree == 3
    options = DigitsOptions.model_validate(config.task.options)
    assert (options.samples_per_agent, options.local_steps, options.lr) == (50, 3, 0.5)
    assert options.partition == "iid" and options.test_fraction == 0.2
