"""Validation of a plugin's own options (an algorithm's, a task's) with one-line errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

OptionsT = TypeVar("OptionsT", bound=BaseModel)


def validate_options(
    model: type[OptionsT], options: Mapping[str, Any] | None, owner: str
) -> OptionsT:
    """Validate ``options`` against ``model``; ``ValueError`` that starts with ``owner`` (say
    ``task 'digits'``) and names every problem, with the allowed options for unknown ones."""
    try:
        return model.model_validate(dict(options or {}))
    except ValidationError as err:
        allowed = ", ".join(model.model_fields) or "none"
        problems = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"])
            message = str(e["msg"]).removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":
                problems.append(f"unknown option '{where}' (allowed: {allowed})")
            elif not where:  # a rule across options: its message names them
                problems.append(message)
            else:
                problems.append(f"option '{where}': {message} (got {e.get('input')!r})")
        raise ValueError(f"{owner}: " + "; ".join(problems)) from None
