"""Building an agent from its settings: the task loaded, the algorithm started from the
task's initial parameters, the fleet's digest of both. Every way of running agents
(processes, in-process fleets, emulators) builds them here."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from airgossip.common.seeds import derive_seed
from airgossip.edge.agent.agent import Agent
from airgossip.edge.agent.checkpoints import CheckpointStore
from airgossip.edge.algorithms import algorithm_class, create_algorithm
from airgossip.edge.observability.stats import StatsSink
from airgossip.edge.observability.telemetry import AgentObserver
from airgossip.edge.settings import (
    AgentSettings,
    gossip_dtype,
    resolve_codec,
    resolve_device,
)
from airgossip.edge.tasks import Distiller, Task, TaskContext, load_task
from airgossip.edge.transport.base import Transport

if TYPE_CHECKING:  # imported only by runs that ask for privacy (Opacus, the accountants)
    from airgossip.edge.privacy.mechanism import PrivacyContext, PrivacyMechanism


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
    privacy: PrivacyContext | None = None,
) -> Agent:
    """Build an agent from settings: load the task, start its algorithm from the task's
    initial parameters. Every way of running agents (processes, in-process fleets,
    emulators) builds them here (see :class:`Agent` for the keyword arguments; ``privacy``:
    the fleet's graph and this agent's pair secrets, for ``[privacy]`` mechanisms that need
    them)."""
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
    digest = fleet_digest(task, initial)
    if settings.privacy.enabled:
        journal = checkpoints.directory / f"{agent_id}.privacy.json" if checkpoints else None
        mechanism = build_privacy(agent_id, num_agents, settings, task, digest, privacy, journal)
        task = private_task(task, mechanism, lambda: algorithm.scalars().get("weight", 1.0))
    return Agent(
        agent_id,
        task=task,
        algorithm=algorithm,
        transport=transport,
        settings=settings,
        stats=stats,
        clock=clock,
        digest=digest,
        observer=observer,
        fleet=fleet,
        checkpoints=checkpoints,
        checkpoint_interval_s=checkpoint_interval_s,
        incarnation=incarnation,
    )


def build_privacy(
    agent_id: str,
    num_agents: int,
    settings: AgentSettings,
    task: Task,
    digest: str,
    context: PrivacyContext | None,
    journal: Path | None = None,
) -> PrivacyMechanism:
    """The agent's ``[privacy]`` mechanism (imported only here: Opacus and the accountants
    load when a run asks for privacy). ``ValueError`` naming what is missing."""
    from airgossip.edge.privacy.mechanism import PrivacyContext, PrivacyMechanism

    return PrivacyMechanism(
        settings.privacy,
        task,
        agent_id=agent_id,
        num_agents=num_agents,
        rounds=settings.rounds,
        seed=derive_seed(settings.seed, agent_id, "privacy"),
        context=context if context is not None else PrivacyContext(),
        run_context=f"{settings.seed}:{digest}".encode(),
        journal=journal,
    )


def private_task(task: Task, mechanism: PrivacyMechanism, weight: Callable[[], float]) -> Task:
    """``task`` trained by ``mechanism``: the agent's seam with ``[privacy]``
    (:class:`airgossip.edge.privacy.task.PrivateTask`)."""
    from airgossip.edge.privacy.task import PrivateTask

    return PrivateTask(task, mechanism, weight=weight)
