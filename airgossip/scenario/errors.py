"""What a bad setting reads as: the error type and the one line it prints.

Light on purpose (pydantic only): the CLI words its early checks of flags with it before the
registries, which import torch, are loaded (``airgossip.cli.early``)."""

from __future__ import annotations

from pydantic import ValidationError


class ConfigError(ValueError):
    """A scenario or flag value that is not valid; the message says what and what is allowed."""


def unknown_setting(where: str) -> str:
    """What a key no setting has reads as (``where``: its dotted path)."""
    return f"unknown setting '{where}'"


def format_validation_error(err: ValidationError, *, within: str = "") -> str:
    """Every problem of ``err`` on one line: ``where: what`` joined by ``; ``; ``within``: the
    table ``err`` is of (its name leads every ``where``)."""
    problems = []
    for e in err.errors():
        where = ".".join(str(p) for p in ([within] if within else []) + list(e["loc"]))
        where = where or "config"
        message = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "mode_table":  # a mode's table, already said table by table
            problems.append(message)
        elif e["type"] == "extra_forbidden":
            problems.append(unknown_setting(where))
        elif e["type"] in ("literal_error",):
            problems.append(f"{where}: {message}, got {e.get('input')!r}")
        else:
            problems.append(f"{where}: {message}")
    return "; ".join(problems)
