"""From a scenario file, a preset and flags to a validated run config."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from airgossip.cli.display import fail

if TYPE_CHECKING:
    from airgossip.scenario.config import Settings


def flag_overrides(
    *,
    agents: int | None = None,
    topology: str | None = None,
    task: str | None = None,
    algorithm: str | None = None,
    rounds: int | None = None,
    loss: float | None = None,
    seed: int | None = None,
    mode: str | None = None,
    device: str | None = None,
    compression: str | None = None,
    pace: str | None = None,
) -> Settings:
    """Flag values given on the command line, shaped like the scenario file."""
    top = {"agents": agents, "topology": topology, "algorithm": algorithm, "rounds": rounds,
           "seed": seed, "mode": mode, "device": device, "compression": compression,
           "pace": pace}  # fmt: skip
    out: Settings = {key: value for key, value in top.items() if value is not None}
    if task is not None:
        out["task"] = {"name": task}
    if loss is not None:
        out["network"] = {"loss": loss}
    return out


def scenario_base(scenario: str) -> Settings:
    """A preset name or scenario file -> its settings (the files it names relative to it)."""
    from airgossip.scenario.config import ConfigError, read_scenario
    from airgossip.scenario.wireless import ScenarioNotFound, scenario_path

    try:
        return read_scenario(scenario_path(scenario))
    except (ScenarioNotFound, ConfigError) as err:
        fail(str(err))


def default_out() -> Path:
    """``runs/<timestamp>``, with a suffix when that folder exists."""
    base = Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    out, n = base, 1
    while out.exists():
        out, n = Path(f"{base}-{n}"), n + 1
    return out
