"""Tasks: the Task protocol, built-in tasks and loading users' own."""

from edge.tasks.base import (
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
from edge.tasks.registry import BUILTIN_TASKS, load_task, resolve_task_factory

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
