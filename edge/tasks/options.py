"""Validation of a task's ``[task]`` options with one-line errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from edge.tasks.base import TaskError

OptionsT = TypeVar("OptionsT", bound=BaseModel)


def parse_options(model: type[OptionsT], options: Mapping[str, Any], task: str) -> OptionsT:
    """Validate ``options`` against ``model``; raise :class:`TaskError` naming what is wrong."""
    try:
        return model.model_validate(dict(options))
    except ValidationError as err:
        allowed = ", ".join(model.model_fields)
        problems = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"]) or "options"
            if e["type"] == "extra_forbidden":
                problems.append(f"unknown option '{where}' (allowed: {allowed})")
            else:
                problems.append(f"option '{where}': {e['msg']} (got {e.get('input')!r})")
        raise TaskError(f"task '{task}': " + "; ".join(problems)) from None
