"""``[ray]`` in a scenario and ``--mode ray`` where Ray is missing: settings checked up front,
one clear line for each refusal (no Ray cluster needed here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import JsonValue
from typer.testing import CliRunner

from airgossip.cli import app
from emulation.config import ConfigError, load_config
from emulation.fleets import FLEETS, preflight, ray_fleet


def test_ray_table_is_read_with_defaults_for_what_it_omits(tmp_path: Path) -> None:
    scenario = tmp_path / "ray.toml"
    scenario.write_text(
        'mode = "ray"\n[ray]\naddress = "auto"\nnum_cpus = 0.5\nplacement = "pack"\n'
        f'max_restarts = -1\ncheckpoints = "{tmp_path}"\n'
    )
    settings = load_config(scenario).ray
    assert (settings.address, settings.num_cpus, settings.num_gpus) == ("auto", 0.5, 0.0)
    assert (settings.placement, settings.max_restarts) == ("pack", -1)
    assert settings.checkpoints == tmp_path
    plain = load_config(None, {}).ray
    assert (plain.address, plain.placement, plain.max_restarts, plain.checkpoints) == (
        None, "spread", 3, None,
    )  # fmt: skip
    strict = load_config(None, {"ray": {"placement": "strict-spread"}}).ray
    assert strict.placement == "strict-spread"
    assert FLEETS["ray"] is ray_fleet.RayFleet and FLEETS["ray"].serves_metrics


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ({"placement": "strict"}, "placement"),
        ({"num_cpus": 0}, "num_cpus"),
        ({"num_gpus": -1}, "num_gpus"),
        ({"max_restarts": -2}, "max_restarts"),
        ({"adress": "auto"}, "adress"),
    ],
)
def test_bad_ray_settings_are_refused_by_name(table: dict[str, JsonValue], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(None, {"mode": "ray", "ray": table})


def test_without_ray_the_mode_says_in_one_line_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ray_fleet, "ray_available", lambda: False)
    with pytest.raises(ConfigError, match=r"pip install 'airgossip\[ray\]'"):
        preflight(load_config(None, {"mode": "ray"}))
    result = CliRunner().invoke(
        app, ["run", "--mode", "ray", "--out", str(tmp_path / "run")], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert lines == ["error: mode 'ray' needs Ray: pip install 'airgossip[ray]'"], lines
    assert not (tmp_path / "run").exists()
