"""``[ray]`` in a scenario and ``--mode ray`` where Ray is missing: settings checked up front,
one clear line for each refusal (no Ray cluster needed here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import JsonValue
from typer.testing import CliRunner

from airgossip.cli import app
from airgossip.emulation.fleets import FLEETS, preflight, ray_fleet
from airgossip.scenario.config import ConfigError, load_config
from airgossip.scenario.modes.ray import RaySettings


def test_ray_table_is_read_with_defaults_for_what_it_omits(tmp_path: Path) -> None:
    scenario = tmp_path / "ray.toml"
    scenario.write_text(
        'mode = "ray"\n[ray]\naddress = "auto"\nnum_cpus = 0.5\nplacement = "pack"\n'
        f'max_restarts = -1\ncheckpoints = "{tmp_path}"\n'
    )
    settings = load_config(scenario).mode_settings(RaySettings)
    assert (settings.address, settings.num_cpus, settings.num_gpus) == ("auto", 0.5, 0.0)
    assert (settings.placement, settings.max_restarts) == ("pack", -1)
    assert settings.checkpoints == tmp_path
    plain = load_config(None, {}).mode_settings(RaySettings)
    assert (plain.address, plain.placement, plain.max_restarts, plain.checkpoints) == (
        None, "spread", 3, None,
    )  # fmt: skip
    strict = load_config(None, {"ray": {"placement": "strict-spread"}}).mode_settings(RaySettings)
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


@pytest.mark.parametrize(
    "address", ["auto", "local", "10.0.0.5:6379", "ray://head:10001", "[::1]:6379"]
)
def test_ray_addresses_ray_takes_are_taken(address: str) -> None:
    assert (
        load_config(None, {"mode": "ray", "ray": {"address": address}})
        .mode_settings(RaySettings)
        .address
        == address
    )


@pytest.mark.parametrize("address", ["head", "head:0", "head:port", "http://head:80", ":6379"])
def test_a_bad_ray_address_is_refused_in_one_line_by_every_way_in(
    address: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="bad Ray address"):
        load_config(None, {"mode": "ray", "ray": {"address": address}})
    runner = CliRunner()
    out = str(tmp_path / "run")
    flag = runner.invoke(
        app, ["run", "--mode", "ray", "--ray-address", address, "--out", out],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert flag.exit_code == 2 and "--ray-address: bad Ray address" in flag.output, flag.output
    assert len(flag.output.strip().splitlines()) == 1, flag.output
    env = runner.invoke(
        app, ["run", "--mode", "ray", "--out", out], env={"COLUMNS": "200", "RAY_ADDRESS": address}
    )
    assert env.exit_code == 2 and "RAY_ADDRESS: bad Ray address" in env.output, env.output


def test_the_ray_address_is_the_flag_then_the_scenario_then_ray_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airgossip.cli.run import _with_ray_address

    plain = load_config(None, {"mode": "ray"})
    scenario = load_config(None, {"mode": "ray", "ray": {"address": "ray://file:10001"}})
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _with_ray_address(plain, None).mode_settings(RaySettings).address is None  # a local Ray
    monkeypatch.setenv("RAY_ADDRESS", "env:6379")
    assert _with_ray_address(plain, None).mode_settings(RaySettings).address == "env:6379"
    assert (
        _with_ray_address(scenario, None).mode_settings(RaySettings).address == "ray://file:10001"
    )
    assert (
        _with_ray_address(scenario, "flag:6379").mode_settings(RaySettings).address == "flag:6379"
    )
    assert _with_ray_address(plain, "local").mode_settings(RaySettings).address == "local"
    # Other modes leave Ray's variable alone.
    assert _with_ray_address(load_config(None, {}), None).mode_settings(RaySettings).address is None


def test_rays_pushed_messages_and_loggers_go_to_the_run_log(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    import logging

    from ray._private import worker

    from airgossip.emulation.fleets.ray_cluster import RayOutput

    before = worker.print_to_stdstream
    output = RayOutput(tmp_path / "logs" / "ray.log")
    output.hold()
    try:
        worker.print_to_stdstream(
            {"lines": ["[state-dump] NodeManager:", "node died"], "pid": "raylet", "is_err": False},
            ignore_prefix=False,
        )
        logging.getLogger("ray.worker").warning("a worker-count warning")
    finally:
        output.release()
    assert worker.print_to_stdstream is before
    assert (
        not logging.getLogger("ray").handlers
        or output.handler not in logging.getLogger("ray").handlers
    )
    text = (tmp_path / "logs" / "ray.log").read_text()
    assert "(raylet) [state-dump] NodeManager:" in text and "a worker-count warning" in text
