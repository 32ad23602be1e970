"""The static network: the same loss, latency and bandwidth on every directed link, on a
named topology, or on the graphs of a ``[switching]`` schedule, one after the other.

In the agent, :class:`BernoulliLinkShaper` applies them on the sending side; every draw
derives from ``(seed, sender, receiver, round, message index)`` alone, so the same seed
gives the same drops and delays whatever the thread timing, process layout or transport. In
a kernel, the loss becomes a per-packet drop probability and the bandwidth a rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from airgossip.common.seeds import hash64
from airgossip.common.topology import (
    Assignment,
    Graph,
    TopologyError,
    TopologySwitcher,
    assignments_for_graph,
    build_graph,
    fleet_figures,
    mixing_lambda2,
    switched_assignments,
)
from airgossip.coordinator.policy import TopologySpec
from airgossip.edge.algorithms import algorithm_class
from airgossip.edge.observability.stats import RoundRecord
from airgossip.edge.transport.base import LinkVerdict
from airgossip.emulation.networks.link_draws import BernoulliDrops
from airgossip.node.network import Clock, KernelLinkState, LinkRuntime, Network
from airgossip.scenario.config import ConfigError
from airgossip.scenario.results import ResolvedFigures


def link_rng(seed: int, sender: str, receiver: str, *keys: int) -> np.random.Generator:
    """A generator private to one (link, key...) tuple, stable across runs and machines."""
    return np.random.default_rng([seed, hash64(sender, receiver), *keys])


@dataclass(frozen=True)
class LinkSpec:
    """One directed link's impairments.

    Attributes
    ----------
    loss:
        Probability that a message is lost (Bernoulli, independent per message).
    latency_s:
        One-way delay added to every message.
    jitter_s:
        Standard deviation of a normal delay added on top (clipped at zero).
    bandwidth_bps:
        Link rate in bits per second; 0 means unlimited.
    """

    loss: float = 0.0
    latency_s: float = 0.0
    jitter_s: float = 0.0
    bandwidth_bps: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss <= 1.0:
            raise ValueError(f"loss must be within [0, 1], got {self.loss}")
        if self.latency_s < 0 or self.jitter_s < 0 or self.bandwidth_bps < 0:
            raise ValueError("latency, jitter and bandwidth must not be negative")


class BernoulliLinkShaper:
    """The same :class:`LinkSpec` on every directed link, or one per link.

    Parameters
    ----------
    default:
        Spec for links not listed in ``links``.
    seed:
        Root of every draw.
    links:
        Optional ``{(sender, receiver): LinkSpec}`` overrides.
    """

    def __init__(
        self,
        default: LinkSpec,
        *,
        seed: int = 0,
        links: dict[tuple[str, str], LinkSpec] | None = None,
    ) -> None:
        self.default = default
        self.seed = seed
        self.links = dict(links or {})

    def spec(self, sender: str, receiver: str) -> LinkSpec:
        return self.links.get((sender, receiver), self.default)

    def plan(self, sender: str, receiver: str, round: int, index: int, nbytes: int) -> LinkVerdict:
        spec = self.spec(sender, receiver)
        if spec.loss == 0 and spec.latency_s == 0 and spec.jitter_s == 0 and not spec.bandwidth_bps:
            return LinkVerdict()
        rng = link_rng(self.seed, sender, receiver, round, index)
        drop = bool(rng.random() < spec.loss)
        delay = spec.latency_s
        if spec.jitter_s:
            delay = max(0.0, delay + float(rng.normal(0.0, spec.jitter_s)))
        if spec.bandwidth_bps:
            delay += 8.0 * nbytes / spec.bandwidth_bps
        return LinkVerdict(drop=drop, delay_s=delay)


class StaticLinks(LinkRuntime):
    """A static network in one process: one shaper, and one graph for ever or the graphs of
    its ``[switching]`` schedule, round after round."""

    def __init__(
        self,
        network: StaticNetwork,
        shaper: BernoulliLinkShaper,
        switcher: TopologySwitcher | None = None,
    ) -> None:
        self.network = network
        self.shaper = shaper
        self.switcher = switcher
        self._graph: Graph | None = None
        self._current: dict[str, Assignment] = {}

    @property
    def switched_at(self) -> list[int]:
        """The first round on each graph after the first."""
        return list(self.switcher.switched_at) if self.switcher is not None else []

    def assignments(self, time_s: float, addresses: dict[str, str]) -> dict[str, Assignment]:
        if self._graph is None:
            self._graph = self.network.first_graph()
        self._current = assignments_for_graph(self._graph, addresses, scheme=self.network.scheme)
        return self._current

    def after_round(
        self, round_index: int, records: Sequence[RoundRecord], addresses: dict[str, str]
    ) -> dict[str, Assignment] | None:
        if self.switcher is None or self.switcher.finished:
            return None
        graph = self.switcher.observe(fleet_figures(round_index, records, len(addresses)))
        if graph is None:
            return None
        scheme = self.network.scheme
        self._current = switched_assignments(self._current, graph, addresses, scheme=scheme)
        return self._current


@dataclass(frozen=True)
class StaticKernelLinks:
    """The static links for a kernel: per-packet drops at the configured loss, the
    configured rate and latency, on every link, from step 0 on."""

    n: int
    loss: float
    #: 0: not limited.
    rate_bps: float
    latency_s: float
    step_s: float = 3600.0
    unapplied: tuple[str, ...] = (
        "message loss as such: the kernel drops packets and TCP retransmits them, so the "
        "configured loss becomes delay and a packet drop rate",
        "jitter",
    )

    def step_of(self, time_s: float) -> int:
        return 0

    def at(self, time_s: float) -> KernelLinkState:
        off_diagonal = ~np.eye(self.n, dtype=bool)
        return KernelLinkState(
            0,
            np.where(off_diagonal, self.loss, 0.0),
            np.where(off_diagonal, self.rate_bps or np.inf, np.inf),
            np.where(off_diagonal, self.latency_s, 0.0),
        )


class StaticNetwork(Network):
    """``[network]`` on the scenario's named topology: loss, latency, jitter and bandwidth,
    the same on every directed link."""

    kind = "static"
    time_varying = False

    @property
    def round_driven(self) -> bool:
        return self.config.switching is not None

    def switcher(self) -> TopologySwitcher | None:
        """A fresh decider of the run's ``[switching]`` schedule (None without one);
        :class:`ConfigError` when one of its graphs cannot be built or cannot serve the
        algorithm."""
        config = self.config
        if config.switching is None:
            return None
        try:
            switcher = TopologySwitcher(config.switching, config.agents, seed=config.seed)
        except TopologyError as err:
            raise ConfigError(f"switching: {err}") from None
        directed = [g.name for g in switcher.graphs if not g.is_undirected]
        if directed and not algorithm_class(config.algorithm).supports_directed:
            raise ConfigError(
                f"algorithm '{config.algorithm}' needs undirected graphs; [switching] goes "
                f"through {', '.join(directed)} (directed)"
            )
        return switcher

    def topology(self) -> TopologySpec:
        config = self.config
        return TopologySpec(
            name=config.topology,
            seed=config.seed,
            edges=tuple(tuple(e) for e in config.edges or ()),  # type: ignore[misc]
            p=config.edge_probability,
            scheme=self.scheme,
        )

    def first_graph(self) -> Graph:
        config = self.config
        try:
            graph = build_graph(
                config.topology,
                config.agents,
                seed=config.seed,
                edges=config.edges,
                p=config.edge_probability,
            )
        except TopologyError as err:
            raise ConfigError(str(err)) from None
        self.check_algorithm(graph)
        self.switcher()  # every graph of a schedule is checked before anything starts
        return graph

    def describe(self) -> str:
        switching = self.config.switching
        graphs = " → ".join(switching.topologies) if switching else self.config.topology
        return f"{graphs} · loss {self.config.network.loss:g}"

    def shaper(self) -> BernoulliLinkShaper:
        """The in-agent shaper of these links."""
        settings = self.config.network
        spec = LinkSpec(
            loss=settings.loss,
            latency_s=settings.latency_ms / 1000,
            jitter_s=settings.jitter_ms / 1000,
            bandwidth_bps=settings.bandwidth_mbps * 1e6,
        )
        return BernoulliLinkShaper(spec, seed=self.config.seed)

    def message_drops(self) -> BernoulliDrops | None:
        """The shaper's drops in batch, where its spec is the same on every link (always,
        as :meth:`shaper` builds it)."""
        shaper = self.shaper()
        if shaper.links:
            return None
        return BernoulliDrops(shaper.seed, shaper.default.loss)

    def runtime(
        self, ids: list[str], clock: Clock | None = None, *, journal: bool = False
    ) -> StaticLinks:
        return StaticLinks(self, self.shaper(), self.switcher())

    def kernel_links(self) -> StaticKernelLinks:
        settings = self.config.network
        return StaticKernelLinks(
            self.config.agents,
            settings.loss,
            settings.bandwidth_mbps * 1e6,
            settings.latency_ms / 1000,
        )

    def resolved(self, graph: Graph, runtime: LinkRuntime | None = None) -> ResolvedFigures:
        figures = ResolvedFigures(
            lambda2=mixing_lambda2(graph, self.scheme),
            topology_period=graph.period,
            edges_per_round=graph.edge_count() / graph.period,
        )
        if isinstance(runtime, StaticLinks) and runtime.switcher is not None:
            figures = figures.model_copy(update={"switched_at": list(runtime.switched_at)})
        return figures
