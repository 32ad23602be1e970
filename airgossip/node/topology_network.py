"""The links as they are: a scenario's named topology (or its ``[switching]`` schedule) with
nothing emulated on them, the network of a device whose links are real.

An agent process on such a device makes this network itself, so it runs without loading the
emulation layer. The emulation layer's static network is this one with a loss, latency, jitter
and rate emulated on every link (in the agent or in the kernel).
"""

from __future__ import annotations

from collections.abc import Sequence

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
from airgossip.edge.transport.base import LinkShaper
from airgossip.node.network import Clock, KernelLinks, LinkRuntime, Network
from airgossip.scenario.config import ConfigError
from airgossip.scenario.results import ResolvedFigures


class TopologyLinks(LinkRuntime):
    """A topology network in one process: one graph for ever or the graphs of its
    ``[switching]`` schedule, round after round; ``shaper`` shapes the links in the agent
    (None: they are as they are)."""

    def __init__(
        self,
        network: TopologyNetwork,
        shaper: LinkShaper | None = None,
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


class TopologyNetwork(Network):
    """The scenario's named topology (or ``[switching]`` schedule), nothing emulated on it."""

    kind = "topology"
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

    def graphs(self) -> str:
        """The topology, or the schedule's topologies in order."""
        switching = self.config.switching
        return " → ".join(switching.topologies) if switching else self.config.topology

    def describe(self) -> str:
        return self.graphs()

    def runtime(
        self, ids: list[str], clock: Clock | None = None, *, journal: bool = False
    ) -> TopologyLinks:
        return TopologyLinks(self, None, self.switcher())

    def kernel_links(self) -> KernelLinks:
        raise ConfigError(
            "these links are as they are: nothing to shape in the kernel (give the scenario a "
            "loss, latency or rate, or a wireless channel, to emulate one)"
        )

    def resolved(self, graph: Graph, runtime: LinkRuntime | None = None) -> ResolvedFigures:
        figures = ResolvedFigures(
            lambda2=mixing_lambda2(graph, self.scheme),
            topology_period=graph.period,
            edges_per_round=graph.edge_count() / graph.period,
        )
        if isinstance(runtime, TopologyLinks) and runtime.switcher is not None:
            figures = figures.model_copy(update={"switched_at": list(runtime.switched_at)})
        return figures
