"""Users' own tasks, ``module:callable``, found by importing the module: torch-free.

A task's module imports what it needs (torch, most likely); finding it does not, so the CLI refuses
a ``module:callable`` that does not exist before torch is imported, with the same words as the agent
that builds the task (:func:`airgossip.edge.tasks.registry.resolve_task_factory` asks here).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any


class TaskError(ValueError):
    """A task that cannot be built (unknown name, bad options, import failure)."""


def import_task_factory(spec: str) -> Callable[..., Any]:
    """The callable ``spec`` (``module:callable``) names; :class:`TaskError` when its module
    cannot be imported or holds no such callable."""
    module_name, _, attr = spec.partition(":")
    # Resolve from the current directory as ``python -m`` does: the ``airgossip`` console
    # script's own folder is on sys.path instead, and a user's ``mytasks.linear`` next to
    # them would not be found.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
        importlib.invalidate_caches()
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise TaskError(f"task '{spec}': cannot import module '{module_name}': {err}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise TaskError(f"task '{spec}': module '{module_name}' has no callable '{attr}'")
    return factory  # type: ignore[no-any-return]
