"""``[privacy]`` at the fleet's level: the run's noise, resolved once before any agent
starts and carried in its config (:func:`check_privacy`), what a way of running agents hands
each agent (the fleet's graph, on which the graph-aware mechanisms calibrate and account,
and the agent's pair secrets), and what a run's results say of its privacy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from airgossip.common.identity import agent_ids, natural_key
from airgossip.common.security.tls import TlsCredentials
from airgossip.edge.observability.stats import RoundRecord
from airgossip.node.network import Network
from airgossip.scenario.config import RunConfig
from airgossip.scenario.results import PairwiseFigures, PrivacyFigures

if TYPE_CHECKING:  # privacy code loads only for runs that ask for it
    from airgossip.edge.privacy.keys import PairSecrets
    from airgossip.edge.privacy.mechanism import PrivacyContext
    from airgossip.edge.privacy.plan import PrivacyGraph
    from airgossip.edge.tasks import Task


def privacy_context(
    config: RunConfig,
    network: Network,
    ids: Sequence[str],
    secrets: PairSecrets | None = None,
) -> PrivacyContext | None:
    """The context of one agent of ``config``'s fleet (None when the run asks for no
    privacy): the first graph of ``network`` over ``ids`` (index order), and ``secrets``."""
    if not config.privacy.enabled:
        return None
    from airgossip.edge.privacy.mechanism import PrivacyContext

    return PrivacyContext(_privacy_graph(network, tuple(ids)), secrets)


@lru_cache(maxsize=4)  # an in-process fleet asks once per agent: build the graph once
def _privacy_graph(network: Network, ids: tuple[str, ...]) -> PrivacyGraph:
    from airgossip.edge.privacy.plan import PrivacyGraph

    static = not network.time_varying and not network.round_driven
    return PrivacyGraph.of(network.first_graph(), ids, network.scheme, static=static)


def run_keyring(config: RunConfig, ids: Sequence[str]) -> dict[str, PairSecrets]:
    """Pair secrets for the agents of an in-process fleet (empty unless the run's mechanism
    pairs agents by secrets): one process, no TLS, so keys are derived from the run's seed."""
    if not config.privacy.mechanism.pair_secrets:
        return {}
    from airgossip.edge.privacy.keys import RunKeyring

    keyring = RunKeyring(ids, seed=config.seed)
    return {i: keyring.for_agent(i) for i in ids}


def hop_distances(adjacency: np.ndarray) -> np.ndarray:
    """``hops[u, v]``: the fewest links from ``u`` to ``v`` (-1 where none lead)."""
    n = adjacency.shape[0]
    hops = np.full((n, n), -1, dtype=np.int64)
    for source in range(n):
        hops[source, source] = 0
        frontier, distance = [source], 0
        while frontier:
            distance += 1
            reached = np.flatnonzero(adjacency[frontier].any(axis=0) & (hops[source] < 0))
            hops[source, reached] = distance
            frontier = list(reached)
    return hops


def privacy_figures(
    config: RunConfig, network: Network, records: Mapping[str, Sequence[RoundRecord]]
) -> PrivacyFigures | None:
    """What ``results.json`` says of a run's privacy: the noise resolved (the plan every
    agent was handed in ``config``) and what the agents' last records spent; for network DP
    the pairwise guarantee of the run's graph, over all pairs and by distance."""
    settings = config.privacy
    if not settings.enabled:
        return None
    from airgossip.edge.privacy.figures import Spent
    from airgossip.edge.privacy.noise import resolve_noise

    ids = sorted(records, key=natural_key)
    if len(ids) != config.agents:  # someone never reported: the launchers' names
        ids = agent_ids(config.agents)
    context = privacy_context(config, network, ids)
    assert context is not None
    graph = context.graph
    plan = resolve_noise(settings, rounds=config.rounds, num_agents=config.agents, graph=graph)
    last = [Spent.from_metrics(r[-1].metrics) for r in records.values() if r]
    spent = [s for s in last if s is not None]
    mechanism = settings.mechanism
    figures = PrivacyFigures(
        mechanism=mechanism.name,
        delta=settings.delta,
        accountant=mechanism.accountant(settings),
        sample_rate=settings.sample_rate,
        max_grad_norm=settings.max_grad_norm,
        noise_multiplier=plan.noise_multiplier,
        gossip_rounds=settings.gossip_rounds,
        budget_epsilon=settings.budget_epsilon,
        exhausted_agents=sum(s.exhausted for s in spent),
    )
    if spent:
        figures.epsilon = max(s.epsilon for s in spent)
    if plan.mask_multiplier:
        figures.mask_multiplier = plan.mask_multiplier
    adversary = mechanism.adversary(settings)
    if adversary is not None:
        figures.adversary = adversary
    if plan.accounted_multiplier:
        figures.accounted_multiplier = plan.accounted_multiplier
    if plan.network is not None and graph is not None:
        rounds = max((s.steps for s in spent), default=0)
        pairwise = plan.pairwise_epsilon(rounds, settings.delta)
        hops = hop_distances(graph.adjacency)
        off = ~np.eye(len(hops), dtype=bool)
        by_distance = {
            str(d): float(np.mean(pairwise[off & (hops == d)]))
            for d in sorted(set(hops[off].tolist()))
            if d > 0
        }
        figures.epsilon_mean = float(np.mean(pairwise[off]))
        figures.pairwise = PairwiseFigures(
            min=float(np.min(pairwise[off])),
            mean=float(np.mean(pairwise[off])),
            max=float(np.max(pairwise[off])),
            by_distance=by_distance,
            exact=plan.network.exact,
        )
    return figures


def check_privacy(config: RunConfig, network: Network, task: Task) -> RunConfig:
    """Everything about ``[privacy]`` that can fail before an agent starts: Opacus missing, a
    task that cannot be trained privately, a graph mechanism on a changing graph, a target
    no noise reaches (``ValueError`` with one line). ``config`` with the noise it resolved
    carried in ``[privacy] resolved_noise``, for every agent and the figures to take."""
    if not config.privacy.enabled:
        return config
    from airgossip.edge.privacy.accounting import opacus_module
    from airgossip.edge.privacy.noise import carried_noise
    from airgossip.edge.tasks import SupportsPrivateTraining

    mechanism = config.privacy.mechanism
    opacus_module("accountants", mechanism.name)
    if not isinstance(task, SupportsPrivateTraining):
        raise ValueError(
            f"privacy mechanism '{mechanism}' clips every example's gradient, "
            f"and task '{task.name}' does not expose its model and data for that (a task needs "
            "private_training(parameters, config): digits has it; a Flower app can use "
            "Flower's own LocalDpMod instead)"
        )
    context = privacy_context(config, network, agent_ids(config.agents))
    assert context is not None
    privacy = carried_noise(config.privacy, rounds=config.rounds, num_agents=config.agents,
                            graph=context.graph)  # fmt: skip
    return config.model_copy(update={"privacy": privacy})


def certificate_secrets(
    config: RunConfig, credentials: TlsCredentials | None, directory: Path | None
) -> PairSecrets | None:
    """An agent process's pair secrets: from its TLS credentials and the partners'
    certificates beside them (None unless the run's mechanism pairs agents by secrets, or
    without TLS, where the agent then refuses to start with a line saying why)."""
    if not config.privacy.mechanism.pair_secrets or credentials is None or directory is None:
        return None
    from airgossip.edge.privacy.keys import CertificateSecrets

    return CertificateSecrets(credentials, directory)
