"""Settings as written: a scenario file read, flags laid over it, before any validation.

Light on purpose (tomllib, and pydantic's JSON types): the CLI reads a scenario file with it
and checks what it can before the settings' models, which import torch, are loaded
(``airgossip.cli.early``); ``airgossip.scenario.config`` validates what these give.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import JsonValue

from airgossip.scenario.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: Settings as written, before they are validated: a scenario file's tables, flags shaped
#: like them, what an agent declares to its coordinator (TOML and JSON both fit).
Settings = dict[str, JsonValue]


def read_scenario(path: Path) -> Settings:
    """Parse a scenario TOML file into its settings; :class:`ConfigError` if unreadable."""
    try:
        with path.open("rb") as handle:
            data: Settings = tomllib.load(handle)
            return data
    except FileNotFoundError:
        raise ConfigError(f"scenario file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"scenario file {path} is not valid TOML: {err}") from None
    except OSError as err:
        raise ConfigError(f"cannot read scenario file {path}: {err.strerror}") from None


def merge(base: Settings, overrides: Settings) -> Settings:
    """Overlay ``overrides`` on ``base``, merging nested tables."""
    out = dict(base)
    for key, value in overrides.items():
        table = out.get(key)
        if isinstance(value, dict) and isinstance(table, dict):
            out[key] = merge(table, value)
        else:
            out[key] = value
    return out
