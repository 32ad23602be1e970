"""From a scenario file, a preset and flags to a validated run config."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from airgossip.cli.display import fail


def flag_overrides(**flags: Any) -> dict[str, Any]:
    """Flag values given on the command line, shaped like the scenario file."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        if value is None:
            continue
        if key == "task":
            out.setdefault("task", {})["name"] = value
        elif key == "loss":
            out.setdefault("network", {})["loss"] = value
        else:
            out[key] = value
    return out


def scenario_base(scenario: str) -> dict[str, Any]:
    """A preset name or scenario file -> its settings (trace paths made absolute)."""
    from emulation.config import ConfigError, read_scenario
    from emulation.scenario import ScenarioNotFound, resolve_trace_paths, scenario_path

    try:
        path = scenario_path(scenario)
        return resolve_trace_paths(read_scenario(path), path.parent)
    except (ScenarioNotFound, ConfigError) as err:
        fail(str(err))


def default_out() -> Path:
    """``runs/<timestamp>``, with a suffix when that folder exists."""
    base = Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    out, n = base, 1
    while out.exists():
        out, n = Path(f"{base}-{n}"), n + 1
    return out
