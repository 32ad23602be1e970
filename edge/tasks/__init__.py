"""Tasks: the Task protocol, built-in tasks and loading users' own.

The names below are loaded on first use (PEP 562): :mod:`airgossip.edge.tasks.custom`, which finds a
user's ``module:callable``, is used by checks that run before torch is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airgossip.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from airgossip.edge.tasks.base import (
        Distiller,
        EvalResult,
        PrivateTraining,
        SupportsPrivateTraining,
        Task,
        TaskContext,
        TaskError,
        TrainConfig,
        TrainResult,
    )
    from airgossip.edge.tasks.registry import BUILTIN_TASKS, load_task, resolve_task_factory

#: Each public name and the module that defines it.
_HOMES = {
    **dict.fromkeys(
        ["Distiller", "EvalResult", "PrivateTraining", "SupportsPrivateTraining", "Task",
         "TaskContext", "TaskError", "TrainConfig", "TrainResult"], "airgossip.edge.tasks.base"),
    **dict.fromkeys(["BUILTIN_TASKS", "load_task", "resolve_task_factory"],
                    "airgossip.edge.tasks.registry"),
}  # fmt: skip


__getattr__ = lazy_exports(__name__, _HOMES)


__all__ = [
    "BUILTIN_TASKS",
    "Distiller",
    "EvalResult",
    "PrivateTraining",
    "SupportsPrivateTraining",
    "Task",
    "TaskContext",
    "TaskError",
    "TrainConfig",
    "TrainResult",
    "load_task",
    "resolve_task_factory",
]
