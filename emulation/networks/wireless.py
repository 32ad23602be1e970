"""The wireless network: a channel model behind every directed link, and the time-varying
gossip graph that comes out of it.

Every agent learns every address (a coordinator hands out the complete graph); which of
them it talks to comes from the channel model, rebuilt every ``graph_interval_s`` and
installed as an assignment with a higher epoch. The links are shaped in the agent by
:class:`~airgossip.emulation.networks.shaper.WirelessLinkShaper` or, step by step, in a kernel.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from airgossip.common.identity import agent_ids
from airgossip.common.topology import Assignment, Graph, mixing_lambda2
from airgossip.coordinator.policy import TopologySpec
from airgossip.edge.agent import Agent
from airgossip.edge.algorithms import algorithm_class
from airgossip.edge.observability.stats import RoundRecord, StatsSink
from airgossip.edge.observability.telemetry import LinkFigures
from airgossip.emulation.channel.model import (
    ChannelBase,
    ChannelModel,
    LinkState,
    channel_model,
    strongly_connected,
)
from airgossip.emulation.channel.traces import TraceError
from airgossip.emulation.networks.gossip_graph import WirelessTopology
from airgossip.emulation.networks.link_records import (
    LinkFiguresSink,
    annotate_rounds,
    write_journal,
    write_link_log,
)
from airgossip.emulation.networks.shaper import WirelessLinkShaper, link_record
from airgossip.node.network import (
    Clock,
    KernelLinkState,
    LinkRuntime,
    LinksCallback,
    Network,
)
from airgossip.scenario.config import ConfigError, RunConfig
from airgossip.scenario.results import ResolvedFigures, RunResults, WirelessFigures
from airgossip.scenario.wireless import WirelessSettings

log = logging.getLogger(__name__)

#: Above this many agents the mixing |lambda2| of a wireless graph (at most
#: ``max_out_degree`` out-links a node) is solved iteratively (ARPACK, relative tolerance
#: 1e-6): at 1,000 agents more than ten times faster than the dense eigenvalues, whose
#: cost grows with the cube of the fleet (docs/performance-history.md has the figures).
LAMBDA2_DENSE_LIMIT = 256


@dataclass
class WirelessRun:
    """What one process needs to emulate a scenario: the model, the graph, the shaper."""

    settings: WirelessSettings
    ids: list[str]
    seed: int
    clock: Clock
    journal: bool = False
    #: A model and its gossip graphs already made for these nodes (the network's own: the
    #: preflight's first graph and the fleet then compute step 0 once).
    shared: tuple[ChannelBase, WirelessTopology] | None = None
    model: ChannelBase = field(init=False)
    topology: WirelessTopology = field(init=False)
    shaper: WirelessLinkShaper = field(init=False)

    def __post_init__(self) -> None:
        if self.shared is not None:
            self.model, self.topology = self.shared
        else:
            self.model = channel_model(self.settings, len(self.ids), self.seed)
            self.topology = WirelessTopology(self.model, self.ids)
        self.shaper = WirelessLinkShaper(self.model, self.ids, self.clock, journal=self.journal)


class WirelessLinks(LinkRuntime):
    """A wireless network in one process: its shaper, graph and figures on one clock."""

    def __init__(self, run: WirelessRun) -> None:
        self.run = run
        self.shaper = run.shaper
        self.clock = run.clock

    def refuse_agent(self, agent_id: str) -> str | None:
        if agent_id not in self.run.ids:
            return (
                f"agent id '{agent_id}' is not one of the wireless scenario's nodes "
                f"({self.run.ids[0]} to {self.run.ids[-1]})"
            )
        return None

    def sink(self, inner: StatsSink | None) -> StatsSink:
        return LinkFiguresSink(inner, self.run.topology, self.clock)

    def assignments(self, time_s: float, addresses: dict[str, str]) -> dict[str, Assignment]:
        topology = self.run.topology
        graph = topology.graph(time_s)
        return {
            agent_id: topology.assignment(graph, node, addresses)
            for node, agent_id in enumerate(topology.ids)
        }

    def compute_ahead(self) -> None:
        self.run.model.compute_ahead()

    def rate_bps(self, sender: str, receiver: str) -> float | None:
        """The channel model's rate of the link now (None: out of range)."""
        index = self.run.shaper.index_of
        i, j = index.get(sender), index.get(receiver)
        if i is None or j is None:
            return None
        state = self.run.model.at(self.clock())
        exists, _, rate, *_ = state.figures(state.link(i, j))
        return float(rate) if exists and rate > 0 else None

    def next_change_s(self, time_s: float) -> float | None:
        topology = self.run.topology
        return topology.graph(time_s).time_s + topology.interval_s

    def link_figures(self, node: int) -> list[LinkFigures]:
        """Node ``node``'s out-links now (those in range, and its gossip out-neighbours)."""
        t = self.clock()
        state = self.run.model.at(t)
        gossip = self.run.topology.graph(t).out_of(node)
        ids = self.run.topology.ids
        out = np.union1d(state.out_links(node), gossip)
        records = [link_record(state, ids, node, int(j)) for j in out if j != node]
        return [
            LinkFigures(r.receiver, r.exists, r.sinr_db, r.rate_bps, r.error_rate, r.bad)
            for r in records
        ]

    def follow(
        self, agent: Agent, stop: threading.Event, on_links: LinksCallback | None = None
    ) -> None:
        """Install the current gossip graph now, then again whenever it changes; hand the
        radio figures of the agent's out-links to ``on_links`` as they change."""
        topology = self.run.topology
        refusal = self.refuse_agent(agent.agent_id)
        if refusal is not None:
            raise ConfigError(refusal)
        node = topology.ids.index(agent.agent_id)
        assignment = agent.assignment
        peers = dict(assignment.peers) if assignment is not None else {}
        peers.pop(agent.agent_id, None)
        current = _Installed()

        def install() -> None:
            graph = topology.graph(self.clock())
            replaced = agent.assignment is not current.assignment
            if replaced and agent.assignment is not None and current.assignment is not None:
                # A coordinator update: take the addresses it knows (a restarted peer may
                # be back at another one).
                peers.update(agent.assignment.peers)
                peers.pop(agent.agent_id, None)
            # Re-install too when something else (a coordinator update) replaced ours.
            if current.epoch != graph.epoch or replaced:
                new = topology.assignment(graph, node, peers)
                agent.set_assignment(new)
                current.epoch, current.assignment = graph.epoch, new

        install()

        def loop() -> None:
            while not stop.wait(min(0.2, topology.interval_s / 4)):
                try:
                    install()
                    if on_links is not None:
                        on_links(self.link_figures(node))
                except Exception:  # the follower must not die silently mid-run
                    log.exception("wireless graph update failed")

        threading.Thread(target=loop, name="wireless-graph", daemon=True).start()


@dataclass
class _Installed:
    """The graph a follower last installed in its agent, and the assignment it made."""

    epoch: int | None = None
    assignment: Assignment | None = None


@dataclass(frozen=True)
class ChannelKernelLinks:
    """The channel model's links for a kernel, one model step at a time."""

    model: ChannelModel
    unapplied: tuple[str, ...] = (
        "message loss as such: packets are dropped and TCP retransmits them, so a "
        "modelled message loss becomes delay",
        "shared air: every directed link has a private rate",
        "changes faster than one model step (fast fading within a step, short bursts)",
    )

    @property
    def step_s(self) -> float:
        return self.model.step_s

    def step_of(self, time_s: float) -> int:
        return self.model.step_of(time_s)

    def at(self, time_s: float) -> KernelLinkState:
        state = self.model.at(time_s)
        assert isinstance(state, LinkState)  # a kernel fleet is small: the dense model
        n = state.n
        packet = self.model.settings.packet_bytes
        loss = np.ones((n, n))
        rate = np.zeros((n, n))
        for i in range(n):
            for j in range(n):
                if i != j:
                    loss[i, j] = state.chunk_loss(i, j, 1, packet)  # one packet
                    if state.exists[i, j]:
                        rate[i, j] = float(state.goodput_bps[i, j])
        np.fill_diagonal(loss, 0.0)
        return KernelLinkState(state.step, loss, rate, np.asarray(state.latency_s, dtype=float))


class WirelessNetwork(Network):
    """``[wireless]``: the channel model of the scenario, on the wall clock or a virtual one."""

    kind = "wireless"
    time_varying = True

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        if config.wireless is None:
            raise ValueError("a wireless network needs a [wireless] table")
        self.settings: WirelessSettings = config.wireless
        self.ids = agent_ids(config.agents)
        self._shared: tuple[ChannelBase, WirelessTopology] | None = None

    def _channel(self, ids: list[str]) -> tuple[ChannelBase, WirelessTopology] | None:
        """The network's model and gossip graphs, made once, for a run of the whole fleet."""
        if ids != self.ids:
            return None
        if self._shared is None:
            model = channel_model(self.settings, len(self.ids), self.config.seed)
            self._shared = (model, WirelessTopology(model, self.ids))
        return self._shared

    @property
    def compute_s(self) -> float:
        return self.settings.compute_s

    @property
    def record(self) -> bool:
        return self.settings.record

    def topology(self) -> TopologySpec:
        # Every agent learns every address; the graph comes from the channel model.
        return TopologySpec(name="complete", seed=self.config.seed, scheme=self.scheme)

    def check_algorithm(self, graph: Graph) -> None:
        if not algorithm_class(self.config.algorithm).supports_directed:
            raise ConfigError(
                f"algorithm '{self.config.algorithm}' needs an undirected graph; wireless "
                "links are directed"
            )

    def first_graph(self) -> Graph:
        self.check_algorithm(Graph("wireless", ()))
        try:
            shared = self._channel(self.ids)
            run = WirelessRun(self.settings, self.ids, self.config.seed, lambda: 0.0,
                              shared=shared)  # fmt: skip
            first = run.topology.graph(0.0)
        except (TraceError, ValueError) as err:
            raise ConfigError(f"bad wireless scenario: {err}") from None
        return Graph(f"wireless:{self.settings.name}", (first.adjacency,))

    def describe(self) -> str:
        return f"wireless {self.settings.name}"

    def launch(self, now_unix: float) -> RunConfig:
        """Stamp the scenario's t = 0 on the wall clock: agents of a real-time run share it."""
        if self.settings.epoch_unix is None:
            self.settings = self.settings.model_copy(update={"epoch_unix": now_unix})
            self.config = self.config.model_copy(update={"wireless": self.settings})
        return self.config

    def wall_clock(self) -> Clock:
        """Seconds since the scenario's t = 0 on the wall clock."""
        epoch = self.settings.epoch_unix if self.settings.epoch_unix is not None else time.time()
        return lambda: time.time() - epoch

    def runtime(
        self, ids: list[str], clock: Clock | None = None, *, journal: bool = False
    ) -> WirelessLinks:
        clock = clock or self.wall_clock()
        run = WirelessRun(self.settings, ids, self.config.seed, clock, journal,
                          shared=self._channel(ids))  # fmt: skip
        return WirelessLinks(run)

    def kernel_links(self) -> ChannelKernelLinks:
        return ChannelKernelLinks(ChannelModel(self.settings, self.config.agents, self.config.seed))

    def resolved(self, graph: Graph, runtime: LinkRuntime | None = None) -> ResolvedFigures:
        adjacency = graph.phases[0]
        connected, _ = strongly_connected(adjacency)
        return ResolvedFigures(
            topology=graph.name,
            lambda2=mixing_lambda2(graph, dense_limit=LAMBDA2_DENSE_LIMIT),
            topology_period=None,
            edges_per_round=int(adjacency.sum()),
            initial_strongly_connected=connected,
        )

    def finish(
        self,
        results: RunResults,
        records: dict[str, list[RoundRecord]],
        out_dir: Path,
        *,
        end_time_s: float,
        runtime: LinkRuntime | None = None,
    ) -> None:
        """Per-round link figures into ``results``; replay logs when the scenario records."""
        annotate_rounds(results, records)
        rows = [r for r in results.rounds if r.gossip_links is not None]
        # An agent's records are in time order and the epochs only grow: its last has its
        # latest epoch.
        epochs = max((rs[-1].metrics.get("graph_epoch", 0) for rs in records.values() if rs),
                     default=0)  # fmt: skip
        figures = WirelessFigures(
            scenario=self.settings.name,
            emulated_s=round(end_time_s, 3),
            graph_epochs=int(epochs),
            mean_radio_links=_mean([r.radio_links for r in rows]),
            mean_gossip_links=_mean([r.gossip_links for r in rows]),
            strongly_connected_share=_mean([r.strongly_connected for r in rows]),
        )
        if self.settings.record:
            run = runtime.run if isinstance(runtime, WirelessLinks) else None
            run = run or WirelessRun(self.settings, self.ids, self.config.seed, lambda: 0.0)
            steps = write_link_log(run.model, self.ids, out_dir / "links.jsonl", end_time_s)
            figures.links_log = "links.jsonl"
            figures.links_log_steps = steps
            if run.shaper.journal is not None:
                write_journal(run.shaper.journal, out_dir / "messages.jsonl")
                figures.messages_log = "messages.jsonl"
        results.wireless = figures


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None
