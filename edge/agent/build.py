"""Building an agent from its settings: the task loaded, the algorithm started from the
task's initial parameters, the fleet's digest of both. Every way of running agents
(processes, in-process fleets, emulators) builds them here."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import torch

from edge.agent.agent import Agent
from edge.agent.checkpoints import CheckpointStore
from edge.algorithms import algorithm_class, create_algorithm
from edge.config.seeds import derive_seed
from edge.config.settings import AgentSettings, gossip_dtype, resolve_codec, resolve_device
from edge.observability.stats import StatsSink
from edge.observability.telemetry import AgentObserver
from edge.tasks import Distiller, Task, TaskContext, load_task
from edge.transport.base import Transport


def fleet_digest(task: Task, initial: torch.Tensor) -> str:
    """Fingerprint of the task and, for shared-initialisation tasks, its initial parameters.

    Peers with different digests refuse each other's messages: averaging independently
    initialised networks destroys accuracy.
    """
    h = hashlib.sha256(f"{task.name}:{initial.numel()}".encode())
    if task.shared_initialisation:
        h.update(initial.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def check_task_fits(algorithm: str, task: Task) -> None:
    """``ValueError`` when the algorithm needs something of the task it lacks (distillation)."""
    if algorithm_class(algorithm).needs_distillation and not isinstance(task, Distiller):
        raise ValueError(
            f"algorithm '{algorithm}' combines models by distillation, and task '{task.name}' "
            "cannot distil (a task needs distill(parameters, teachers, config): digits has it)"
        )


def build_agent(
    agent_id: str,
    *,
    index: int,
    num_agents: int,
    settings: AgentSettings,
    transport: Transport,
    stats: StatsSink | None = None,
    clock: Callable[[], float] = time.monotonic,
    observer: AgentObserver | None = None,
    fleet: str = "",
    checkpoints: CheckpointStore | None = None,
    checkpoint_interval_s: float = 5.0,
    incarnation: int = 0,
) -> Agent:
    """Build an agent from settings: load the task, start its algorithm from the task's
    initial parameters. Every way of running agents (processes, in-process fleets,
    emulators) builds them here (see :class:`Agent` for the keyword arguments)."""
    context = TaskContext(
        agent_index=index,
        num_agents=num_agents,
        seed=settings.seed,
        device=resolve_device(settings.device),
        options=settings.task.options,
    )
    task = load_task(settings.task.name, context)
    initial = task.initial_parameters()
    dtype = gossip_dtype(settings, task.gossip_dtype)
    check_task_fits(settings.algorithm, task)
    algorithm = create_algorithm(
        settings.algorithm,
        initial,
        dtype=dtype,
        codec=resolve_codec(settings, dtype),
        seed=derive_seed(settings.seed, agent_id),
        options=settings.algorithm_options,
        shared_start=task.shared_initialisation,
    )
    return Agent(
        agent_id,
        task=task,
        algorithm=algorithm,
        transport=transport,
        settings=settings,
        stats=stats,
        clock=clock,
        digest=fleet_digest(task, initial),
        observer=observer,
        fleet=fleet,
        checkpoints=checkpoints,
        checkpoint_interval_s=checkpoint_interval_s,
        incarnation=incarnation,
    )
