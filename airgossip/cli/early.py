"""Flags checked before anything heavy is imported, so that a bad one is answered at once.

The settings' own validation (``emulation.config``) needs the registries, and they import
torch: seconds before a typo is reported. What a flag can be checked against without them
is checked here first, with the names ``registry_names.json`` holds (generated from the
registries and checked against them) and the same bounds, in the same words as the full
validation: ``tests/system/test_cli_early.py`` holds the two to the same message for every
bad value. What needs the registries themselves (a graph an algorithm refuses, a custom
task) is left to the full validation that follows.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from airgossip.cli.choices import registry_names
from airgossip.cli.display import fail
from emulation.errors import format_validation_error

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:
    from emulation.config import Settings


class _Network(BaseModel):
    model_config = ConfigDict(extra="ignore")

    loss: float = Field(0.0, ge=0, lt=1)


class _Flags(BaseModel):
    """The bounds of the flags' settings, as ``RunConfig`` and ``AgentSettings`` set them."""

    model_config = ConfigDict(extra="ignore")

    agents: int = Field(8, ge=1, le=100_000)
    rounds: int = Field(40, ge=1, le=10_000_000)
    seed: int = Field(0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    network: _Network = Field(default_factory=_Network)


def _names(placeholder: str) -> list[str]:
    return registry_names()[placeholder].split(", ")


def _settings_problem(flags: Settings) -> str | None:
    """What the full validation would say of these flags' values (first problem), or None."""
    topology = flags.get("topology")
    if isinstance(topology, str) and topology not in _names("topologies"):
        return (
            f"topology: unknown topology '{topology}'; choose one of: "
            f"{registry_names()['topologies']}"
        )
    algorithm = flags.get("algorithm")
    if isinstance(algorithm, str) and algorithm not in _names("algorithms"):
        return (
            f"algorithm: unknown algorithm '{algorithm}'; choose one of: "
            f"{registry_names()['algorithms']}"
        )
    compression = flags.get("compression")
    families = {form.partition(":")[0] for form in _names("codecs")}
    if (
        isinstance(compression, str)
        and compression != "none"
        and compression.partition(":")[0] not in families
    ):
        return (
            f"compression: unknown compression '{compression}'; choose one of: none, "
            f"{registry_names()['codecs']}"
        )
    try:
        _Flags.model_validate(flags)
    except ValidationError as err:
        return format_validation_error(err)
    return None


def check_scenario_file(path: Path) -> None:
    """Refuse a scenario file that cannot be read or is not TOML, as ``read_scenario`` does."""
    try:
        with path.open("rb") as handle:
            tomllib.load(handle)
    except FileNotFoundError:
        fail(f"scenario file {path} does not exist")
    except tomllib.TOMLDecodeError as err:
        fail(f"scenario file {path} is not valid TOML: {err}")
    except OSError as err:
        fail(f"cannot read scenario file {path}: {err.strerror}")


def check_flags(flags: Settings, config: Path | None = None) -> None:
    """Refuse (one line, exit 2) flag values the full validation would refuse, worded as it
    words them; ``config``: the scenario file the flags override (it names the source, and
    is read here: a missing or broken file is refused first, as the full check does)."""
    if config is not None:
        check_scenario_file(config)
    problem = _settings_problem(flags)
    if problem is not None:
        source = f"scenario {config}" if config is not None else "settings"
        fail(f"bad {source}: {problem}")
    mode = flags.get("mode")
    if isinstance(mode, str) and mode not in _names("mode_names"):
        fail(f"unknown mode '{mode}'; choose one of: {registry_names()['mode_names']}")
    task = flags.get("task")
    name = task.get("name") if isinstance(task, dict) else None
    if isinstance(name, str) and name not in _names("tasks") and ":" not in name:
        fail(
            f"unknown task '{name}'; choose one of: {registry_names()['tasks']}, "
            "or give your own as module:callable"
        )


def check_scenario(scenario: str | None) -> None:
    """Refuse a ``--scenario`` that is neither a preset nor a file, as the full check does."""
    if scenario is None:
        return
    candidate = Path(scenario)
    if candidate.suffix == ".toml" or candidate.exists():
        if not candidate.exists():
            fail(f"scenario file {candidate} does not exist")
        return
    if scenario not in _names("presets"):
        fail(
            f"unknown scenario '{scenario}'; choose one of: {registry_names()['presets']}, "
            "or give a .toml file"
        )


def check_policy(topology: str | None) -> None:
    """Refuse a coordinator's ``--topology`` that is neither a graph nor its own ``k-out``."""
    names = [*_names("topologies"), "k-out"]
    if topology is not None and topology not in names:
        fail(f"unknown topology '{topology}'; choose one of: {', '.join(names)}")


def check_port(flag: str, port: int | None, *, lowest: int = 0) -> None:
    """Refuse a port number outside ``lowest``..65535."""
    if port is not None and not lowest <= port <= 65535:
        fail(f"{flag} must be within {lowest}..65535, got {port}")
