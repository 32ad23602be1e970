"""A run's noise, resolved once: before the run starts (:func:`resolve_noise` on the whole
fleet's inputs), carried to every agent and to the run's figures in ``[privacy]
resolved_noise`` (:func:`carried_noise`), and taken from there wherever the inputs are the
same. Every input is the fleet's (settings, rounds, size, graph), so an agent given no plan,
or a plan for other inputs (an older config, a fleet resized by its peer list), resolves the
same one itself: no agent needs to ask another.
"""

from __future__ import annotations

import hashlib
import math

from airgossip.edge.privacy.accounting import PrivacyError
from airgossip.edge.privacy.mechanisms.base import listed
from airgossip.edge.privacy.mechanisms.registry import MECHANISMS
from airgossip.edge.privacy.plan import NoisePlan, PrivacyGraph
from airgossip.edge.privacy.settings import PrivacySettings, ResolvedNoise

#: The version of :class:`~airgossip.edge.privacy.settings.ResolvedNoise`'s content, part of its
#: ``inputs``: a plan carried in another version never matches and is resolved again.
CARRIED_VERSION = 1


def noise_inputs(
    settings: PrivacySettings, *, rounds: int, num_agents: int, graph: PrivacyGraph | None
) -> str:
    """A fingerprint of everything the noise of ``settings`` is resolved from."""
    h = hashlib.sha256(f"v{CARRIED_VERSION}:{rounds}:{num_agents}:".encode())
    h.update(settings.model_dump_json(exclude={"resolved_noise"}).encode())
    if settings.mechanism.needs_graph and graph is not None:
        h.update(graph.digest.encode())
    return f"v{CARRIED_VERSION}:{h.hexdigest()[:32]}"


def resolve_noise(
    settings: PrivacySettings, *, rounds: int, num_agents: int, graph: PrivacyGraph | None
) -> NoisePlan:
    """The run's :class:`~airgossip.edge.privacy.plan.NoisePlan` for ``rounds`` rounds (of which the
    private ones, every ``gossip_rounds``, are what the accountant composes): the one
    ``settings`` carries where it was resolved from these inputs, else resolved here.
    :class:`PrivacyError` when it cannot be made (a graph mechanism without the graph, or on
    a graph that changes; a target no noise reaches)."""
    mechanism = settings.mechanism
    if not mechanism.enabled:
        raise PrivacyError("no privacy mechanism: there is no noise to resolve")
    if mechanism.needs_graph and graph is None:
        raise PrivacyError(
            f"privacy mechanism '{mechanism}' depends on the fleet's graph, which this agent "
            "was not given (agents started by a run or by a coordinator's scenario know it)"
        )
    if mechanism.fixed_graph and graph is not None and not graph.static:
        anywhere = [m.name for m in MECHANISMS.values() if m.enabled and not m.fixed_graph]
        raise PrivacyError(
            f"privacy mechanism '{mechanism}' is accounted for one fixed graph; this run's "
            f"graph changes (use {listed(anywhere, 'or')}, whose guarantees hold on any graph)"
        )
    carried = settings.resolved_noise
    inputs = noise_inputs(settings, rounds=rounds, num_agents=num_agents, graph=graph)
    if carried is not None and carried.inputs == inputs:
        plan = NoisePlan(
            carried.noise_multiplier, carried.mask_multiplier, carried.accounted_multiplier
        )
        return mechanism.complete(plan, rounds=rounds, graph=graph)
    return mechanism.plan(settings, rounds=rounds, num_agents=num_agents, graph=graph)


def carried_noise(
    settings: PrivacySettings, *, rounds: int, num_agents: int, graph: PrivacyGraph | None
) -> PrivacySettings:
    """``settings`` with the noise resolved from these inputs carried in ``resolved_noise``
    (as they are where privacy is off, or where a multiplier is unbounded: JSON holds no
    infinity, and such a plan is resolved again where it is needed)."""
    if not settings.enabled:
        return settings
    plan = resolve_noise(settings, rounds=rounds, num_agents=num_agents, graph=graph)
    figures = (plan.noise_multiplier, plan.mask_multiplier, plan.accounted_multiplier)
    if not all(math.isfinite(f) for f in figures):
        return settings.model_copy(update={"resolved_noise": None})
    resolved = ResolvedNoise(
        inputs=noise_inputs(settings, rounds=rounds, num_agents=num_agents, graph=graph),
        noise_multiplier=plan.noise_multiplier,
        mask_multiplier=plan.mask_multiplier,
        accounted_multiplier=plan.accounted_multiplier,
    )
    return settings.model_copy(update={"resolved_noise": resolved})
