"""Built-in tasks by name, and users' own tasks as ``module:callable``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from airgossip.common.plugins import PluginRegistry
from airgossip.edge.tasks.custom import TaskError, import_task_factory

if TYPE_CHECKING:
    from airgossip.edge.tasks.base import Task, TaskContext

TaskFactory = Callable[["TaskContext"], "Task"]

#: Tasks by the name users pick with ``--task`` (``flower``: with ``--flower-app``), one line
#: each; a task's module (torch, Flower) is imported when it is looked up.
BUILTIN_TASKS: PluginRegistry[TaskFactory] = PluginRegistry(
    "task",
    {
        "digits": "airgossip.edge.tasks.digits:DigitsTask",
        "consensus": "airgossip.edge.tasks.consensus:ConsensusTask",
        "separable": "airgossip.edge.tasks.separable:SeparableTask",
        "flower": "airgossip.edge.tasks.flower.task:FlowerTask",
    },
)


def resolve_task_factory(spec: str) -> TaskFactory:
    """Find the factory for a built-in name or a ``module:callable`` spec."""
    if spec in BUILTIN_TASKS:
        return BUILTIN_TASKS[spec]
    if ":" not in spec:
        raise TaskError(
            f"unknown task '{spec}'; choose one of: {', '.join(BUILTIN_TASKS)}, "
            "or give your own as module:callable"
        )
    return cast(TaskFactory, import_task_factory(spec))


def load_task(spec: str, context: TaskContext) -> Task:
    """Build the task ``spec`` for one agent.

    The factory runs with torch's global RNG seeded by the fleet seed, so a user's model,
    initialised the ordinary way, starts identical on every agent.
    """
    import torch

    factory = resolve_task_factory(spec)
    with torch.random.fork_rng(devices=[]):
        if context.device.type == "cuda":
            torch.manual_seed(context.seed)  # CPU and every GPU generator
        else:
            # The CPU generator only: torch.manual_seed also queues a lazy CUDA seeding that
            # records a stack trace, a visible cost when a process builds 1,000 agents.
            torch.default_generator.manual_seed(context.seed)
        task = factory(context)
    missing = [m for m in ("initial_parameters", "train", "evaluate") if not hasattr(task, m)]
    if missing:
        raise TaskError(f"task '{spec}' built an object without {', '.join(missing)}")
    for attribute, default in (("shared_initialisation", True), ("gossip_dtype", torch.float32)):
        if not hasattr(task, attribute):
            setattr(task, attribute, default)
    if not hasattr(task, "name"):
        task.name = spec
    initial = task.initial_parameters()
    if not isinstance(initial, torch.Tensor) or initial.dim() != 1:
        raise TaskError(f"task '{spec}': initial_parameters() must return a flat torch tensor")
    return task
