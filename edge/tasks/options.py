"""Validation of a task's ``[task]`` options with one-line errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

from airgossip.common.options import validate_options
from airgossip.edge.tasks.base import TaskError

OptionsT = TypeVar("OptionsT", bound=BaseModel)


def parse_options(model: type[OptionsT], options: Mapping[str, Any], task: str) -> OptionsT:
    """Validate ``options`` against ``model``; raise :class:`TaskError` naming what is wrong."""
    try:
        return validate_options(model, options, f"task '{task}'")
    except ValueError as err:
        raise TaskError(str(err)) from None
