"""What the commands that run Flower apps share: flags to task options, rounds from the
app, and Flower's side effects kept inside the run's folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from airgossip.cli.display import fail

if TYPE_CHECKING:  # the CLI imports Flower only when a command runs a Flower app
    from pydantic import JsonValue

    from airgossip.edge.tasks.flower.app import RunConfigValue
    from airgossip.scenario.config import RunConfig, Settings


def app_spec(app: str) -> str:
    """A project folder made absolute (agents and config.json must not depend on the
    launcher's folder); ``module:attr`` as given."""
    path = Path(app)
    return str(path.resolve()) if path.is_dir() else app


def parse_run_config_flag(text: str | None) -> dict[str, RunConfigValue]:
    """``--run-config 'k=v ...'`` as Flower reads it; one-line error if malformed."""
    if text is None:
        return {}
    from airgossip.edge.tasks.flower import FlowerAppError
    from airgossip.edge.tasks.flower.app import parse_run_config

    try:
        return dict(parse_run_config(text))
    except FlowerAppError as err:
        fail(str(err))


def flower_overrides(
    app: str | None,
    run_config: str | None,
    accuracy_metric: str | None,
    loss_metric: str | None,
    *,
    server_app: str | None = None,
) -> Settings:
    """The ``[task]`` settings the Flower flags of ``airgossip run`` give."""
    out: Settings = {}
    if app is not None:
        out.update(name="flower", app=app_spec(app))
    if server_app is not None:
        if ":" not in server_app or server_app.startswith(":") or server_app.endswith(":"):
            fail(f"--server-app must be module:attr of a ServerApp, got '{server_app}'")
        out["server_app"] = server_app
    if run_config is not None:
        values: dict[str, JsonValue] = dict(parse_run_config_flag(run_config))
        out["run_config"] = values
    if accuracy_metric is not None:
        out["accuracy_metric"] = accuracy_metric
    if loss_metric is not None:
        out["loss_metric"] = loss_metric
    return out


def with_flower_rounds(config: RunConfig, flags: Settings) -> RunConfig:
    """``config`` with the app's ``num-server-rounds`` as its rounds, unless rounds were
    set (``--rounds`` or the scenario file)."""
    if config.task.name != "flower":
        given = [f"--{k.replace('_', '-')}" for k in flags if k != "name"]
        if given:
            fail(f"{', '.join(given)} apply to a Flower app: add --flower-app PATH|module:attr")
        return config
    if "rounds" in config.model_fields_set:
        return config
    from airgossip.edge.tasks.flower import FlowerAppError, load_flower_app

    options = config.task.options
    try:
        app = load_flower_app(
            str(options.get("app", "")), options.get("run_config"),
            server_app=options.get("server_app"),
        )  # fmt: skip
    except FlowerAppError as err:
        fail(str(err))
    rounds = app.run_config.get("num-server-rounds")
    if rounds is None:
        return config
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        fail(f"flower app '{app.spec}': num-server-rounds must be a positive integer, "
             f"got {rounds!r}")  # fmt: skip
    return config.model_copy(update={"rounds": rounds})


def contain_flower(out_dir: Path) -> None:
    """Keep Flower's side effects inside the run: no telemetry, no update checks, and its
    home folder (where it would keep state) under ``out_dir``; agent processes inherit."""
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    os.environ["FLWR_HOME"] = str((out_dir / "flower-home").resolve())
