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
    """Parse a scenario TOML file into its settings, the files it names made relative to
    its folder (:func:`files_beside`); :class:`ConfigError` if unreadable."""
    try:
        with path.open("rb") as handle:
            data: Settings = tomllib.load(handle)
            return files_beside(data, path.parent)
    except FileNotFoundError:
        raise ConfigError(f"scenario file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"scenario file {path} is not valid TOML: {err}") from None
    except OSError as err:
        raise ConfigError(f"cannot read scenario file {path}: {err.strerror}") from None


def files_beside(data: Settings, folder: Path) -> Settings:
    """``data`` with the files a scenario names (``[[wireless.traces]]``' ``file``, a device
    class's ``availability.file``) relative to ``folder``, the scenario file's own, where
    they are not absolute."""
    wireless = data.get("wireless")
    traces = wireless.get("traces") if isinstance(wireless, dict) else None
    if isinstance(wireless, dict) and isinstance(traces, list):
        data = {**data, "wireless": {**wireless, "traces": [_beside(t, folder) for t in traces]}}
    classes = data.get("device_classes")
    if isinstance(classes, list):
        data = {**data, "device_classes": [
            {**c, "availability": _beside(c["availability"], folder)}
            if isinstance(c, dict) and isinstance(c.get("availability"), dict) else c
            for c in classes
        ]}  # fmt: skip
    return data


def _beside(entry: JsonValue, folder: Path) -> JsonValue:
    """A table whose ``file`` is relative to ``folder``, where it named a relative path."""
    file = entry.get("file") if isinstance(entry, dict) else None
    if not isinstance(entry, dict) or not isinstance(file, str) or Path(file).is_absolute():
        return entry
    return {**entry, "file": str(folder / file)}


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
