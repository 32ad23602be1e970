"""Finding and loading a Flower app the way Flower's runtime does.

An app is either a project folder as ``flwr new`` lays it out (its ``pyproject.toml`` names
the apps under ``[tool.flwr.app.components]`` and the run config under
``[tool.flwr.app.config]``; the folder is put on ``sys.path``, as Flower does) or a
``module:attr`` naming a ``ClientApp``. Loading, config fusing and ``--run-config`` parsing
are Flower's own functions, so an app behaves here as under ``flwr run``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airgossip.edge.tasks.base import TaskError

# Flower sends telemetry and checks for updates unless told not to, and reads both switches
# when its modules are imported: they are set before the first `import flwr` of the process.
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"

import flwr.supercore.telemetry as _flower_telemetry
from flwr.app.typing import ConfigRecordValues
from flwr.clientapp import ClientApp
from flwr.common.config import (
    flatten_dict,
    get_project_config,
    parse_config_args,
)
from flwr.serverapp import ServerApp
from flwr.supercore.object_ref import load_app

# A process that imported Flower before this module has read the switch already.
_flower_telemetry.FLWR_TELEMETRY_ENABLED = "0"

#: Values a Flower run config may hold.
RunConfigValue = bool | int | float | str
#: A round's config as a strategy hands it to a ClientApp (a ConfigRecord's contents: the run
#: config's values, the strategy's, ``server-round``).
RoundConfig = dict[str, ConfigRecordValues]


class FlowerAppError(TaskError):
    """A Flower app that cannot be found, loaded or run; the message names the app."""


@dataclass(frozen=True)
class FlowerApp:
    """A Flower app located and its run config fused (the app's defaults + overrides).

    Attributes
    ----------
    spec:
        The app as the user named it (a folder or ``module:attr``).
    project_dir:
        The app's project folder (``None`` for ``module:attr``); put on ``sys.path``.
    client_ref:
        ``module:attr`` of the ``ClientApp``.
    server_ref:
        ``module:attr`` of the ``ServerApp``, when known.
    run_config:
        Flat run config, as ``context.run_config`` holds it.
    """

    spec: str
    project_dir: Path | None
    client_ref: str
    server_ref: str | None
    run_config: dict[str, RunConfigValue] = field(default_factory=dict)

    def _load(self, ref: str, kind: type[Any]) -> Any:
        try:
            loaded = load_app(ref, FlowerAppError, self.project_dir)
        except FlowerAppError as err:
            raise FlowerAppError(f"flower app '{self.spec}': {_one_line(str(err))}") from None
        except Exception as err:  # an import of the user's code may raise anything
            raise FlowerAppError(
                f"flower app '{self.spec}': importing '{ref}' raised "
                f"{type(err).__name__}: {_one_line(str(err))}"
            ) from None
        if not isinstance(loaded, kind):
            raise FlowerAppError(
                f"flower app '{self.spec}': '{ref}' is a {type(loaded).__name__}, "
                f"not a {kind.__name__}"
            )
        return loaded

    def client_app(self) -> ClientApp:
        """Import the ``ClientApp`` (its project folder on ``sys.path``, as Flower does)."""
        app: ClientApp = self._load(self.client_ref, ClientApp)
        return app

    def server_app(self) -> ServerApp | None:
        """Import the ``ServerApp``, if the app names one."""
        if self.server_ref is None:
            return None
        app: ServerApp = self._load(self.server_ref, ServerApp)
        return app


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _is_reference(spec: str) -> bool:
    module, _, attr = spec.partition(":")
    return bool(module) and bool(attr) and "/" not in spec and not Path(spec).exists()


def parse_run_config(text: str) -> dict[str, RunConfigValue]:
    """``'k=v k2="s"'`` (or a TOML file's path) as ``flwr run --run-config`` reads it."""
    try:
        parsed: dict[str, RunConfigValue] = parse_config_args([text])
    except Exception as err:  # click.ClickException, ValueError, OSError from Flower
        message = getattr(err, "message", None) or str(err)
        raise FlowerAppError(f"--run-config {text!r}: {_one_line(message)}") from None
    if not parsed and text.strip():
        raise FlowerAppError(f"--run-config {text!r}: expected key=value pairs")
    return parsed


def load_flower_app(
    spec: str,
    run_config: Mapping[str, Any] | None = None,
    *,
    server_app: str | None = None,
) -> FlowerApp:
    """Locate the app ``spec`` and fuse its run config with ``run_config`` overrides.

    Parameters
    ----------
    spec:
        A Flower project folder (with ``pyproject.toml``) or ``module:attr`` of a
        ``ClientApp``.
    run_config:
        Overrides of the app's run config (nested tables are flattened with dots, as Flower
        does); for a project, every key must be one the app declares.
    server_app:
        ``module:attr`` of the ``ServerApp`` (default: the project's own).

    Raises
    ------
    FlowerAppError
        The app cannot be found, its ``pyproject.toml`` is not a Flower app's, or an
        override names a key the app does not have.
    """
    overrides = flatten_dict(dict(run_config or {}))
    if _is_reference(spec):
        return FlowerApp(spec, None, spec, server_app, dict(overrides))
    folder = Path(spec)
    if not folder.is_dir():
        raise FlowerAppError(
            f"flower app '{spec}' is neither a folder nor module:attr of a ClientApp"
        )
    try:
        project = get_project_config(folder)
    except FileNotFoundError:
        raise FlowerAppError(
            f"flower app '{spec}' has no pyproject.toml (a Flower app project, as `flwr new` "
            "makes one, or module:attr of a ClientApp)"
        ) from None
    except Exception as err:  # Flower lists every problem of the file
        problems = "; ".join(line.strip(" -") for line in str(err).splitlines()[1:] if line.strip())
        raise FlowerAppError(f"flower app '{spec}': {problems or _one_line(str(err))}") from None
    app_table = project["tool"]["flwr"]["app"]
    defaults = flatten_dict(app_table.get("config", {}))
    unknown = [key for key in overrides if key not in defaults]
    if unknown:
        raise FlowerAppError(
            f"flower app '{spec}': run config has no key {', '.join(map(repr, unknown))} "
            f"(its keys: {', '.join(defaults) or 'none'})"
        )
    components = app_table["components"]
    return FlowerApp(
        spec=spec,
        project_dir=folder.resolve(),
        client_ref=str(components["clientapp"]),
        server_ref=server_app or str(components["serverapp"]),
        run_config={**defaults, **overrides},
    )
