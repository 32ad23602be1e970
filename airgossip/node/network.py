"""The network contract: what the links between agents are, whichever fleet runs the agents.

A :class:`Network` is one kind of link (a static network of loss, latency and bandwidth; a
wireless channel model). It provides everything a fleet needs about the links, so that no
fleet ever asks which kind it has:

* the topology a coordinator hands out at the start and the first gossip graph (checked
  against the algorithm before anything starts);
* a :class:`LinkRuntime` per process and clock: the in-agent link shaper, the sink that
  adds the network's figures to round records, the graph at a given time, and a follower
  that keeps a real-time agent on the current graph;
* :class:`KernelLinks`: each step's per-link loss, rate and latency, for the kernel link
  applier of namespaces and containers;
* what it adds to ``results.json`` (the resolved config, per-round annotations, logs).

A network never knows which fleet runs it.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from airgossip.common.identity import agent_id
from airgossip.common.topology import Assignment, Graph, TopologySwitcher
from airgossip.coordinator.policy import TopologySpec
from airgossip.edge.agent import Agent
from airgossip.edge.algorithms import algorithm_class
from airgossip.edge.algorithms.graph_needs import directed_graph_refusal, supports_directed
from airgossip.edge.algorithms.robust import CSPlusOptions, cs_plus_never_mixing
from airgossip.edge.observability.stats import RoundRecord, StatsSink
from airgossip.edge.observability.telemetry import LinkFigures
from airgossip.edge.transport.base import LinkShaper
from airgossip.scenario.config import ConfigError, RunConfig
from airgossip.scenario.results import ResolvedFigures, RunResults

log = logging.getLogger(__name__)

#: Seconds since the scenario's t = 0 (a wall clock or a virtual one).
Clock = Callable[[], float]
#: Receives the radio figures of an agent's out-links as they change.
LinksCallback = Callable[[list[LinkFigures]], None]


@dataclass(frozen=True)
class KernelLinkState:
    """Every directed link of one step as a kernel can apply it (``[i, j]``: i to j).

    Attributes
    ----------
    step:
        The step these values hold for.
    loss:
        Probability that one packet is dropped (1 where the link does not exist).
    rate_bps:
        Link rate, bit/s; ``inf`` where the network sets none (an applier clamps to what
        its kernel can do).
    latency_s:
        One-way delay added to every packet.
    """

    step: int
    loss: np.ndarray
    rate_bps: np.ndarray
    latency_s: np.ndarray


class KernelLinks(Protocol):
    """A network's links, step by step, for a kernel link applier."""

    @property
    def step_s(self) -> float:
        """How often the links change (seconds)."""

    @property
    def unapplied(self) -> tuple[str, ...]:
        """What the network models that a kernel cannot apply (said on the console and kept
        in the run's records)."""

    def step_of(self, time_s: float) -> int: ...

    def at(self, time_s: float) -> KernelLinkState: ...


class LinkRuntime(ABC):
    """A network's links in one process, on one clock."""

    #: The in-agent link shaper (None: the links are not shaped in the agent).
    shaper: LinkShaper | None
    #: The decider of a round-driven graph schedule (None: the graph does not change by
    #: round). Fleets in one process feed it through :meth:`after_round`; a fleet of agent
    #: processes hands it to its coordinator, which sees every agent's round reports.
    switcher: TopologySwitcher | None = None

    def refuse_agent(self, agent_id: str) -> str | None:
        """Why ``agent_id`` cannot be one of these links' agents (None: it can)."""
        return None

    def sink(self, inner: StatsSink | None) -> StatsSink | None:
        """The sink round records go through: the network may add its figures to them."""
        return inner

    @abstractmethod
    def assignments(self, time_s: float, addresses: dict[str, str]) -> dict[str, Assignment]:
        """Every agent's assignment for the graph at ``time_s`` (``addresses``: every agent,
        in fleet order)."""

    def next_change_s(self, time_s: float) -> float | None:
        """When the graph changes next after ``time_s`` (None: never)."""
        return None

    def after_round(
        self, round_index: int, records: Sequence[RoundRecord], addresses: dict[str, str]
    ) -> dict[str, Assignment] | None:
        """Every agent has finished ``round_index`` (``records``: what they reported for it,
        if it was a reported round): every agent's new assignment when the graph changes from
        the next round on (a schedule that switches graphs by round or by the fleet's
        figures), else None. Fleets that run agents in this process call it."""
        return None

    def rate_bps(self, sender: str, receiver: str) -> float | None:
        """The rate (bit/s) the network models for the link ``sender -> receiver`` now, for
        an energy ledger's airtime (None: it models none, or the link is down)."""
        return None

    def compute_ahead(self) -> None:  # noqa: B027 - optional hook
        """A fleet that asks the links' model for its steps in order (one on a virtual clock)
        may have them computed ahead, on another CPU, where the network can."""

    def follow(  # noqa: B027 - optional hook
        self, agent: Agent, stop: threading.Event, on_links: LinksCallback | None = None
    ) -> None:
        """Keep a real-time agent on the network's current graph until ``stop`` (a network
        whose graph never changes leaves the agent's assignment alone)."""


class BatchedDrops(Protocol):
    """A network's drop verdicts for many messages at once (for batched fleets)."""

    def link_keys(self, ids: list[str], senders: np.ndarray, receivers: np.ndarray
                  ) -> np.ndarray:  # fmt: skip
        """A key per directed link (node indices into ``ids``), computed once per graph."""
        ...

    def dropped(self, keys: np.ndarray, round_index: int, indexes: np.ndarray) -> np.ndarray:
        """Whether each message is lost: ``keys[k]``'s link, message ``indexes[k]`` on that
        link (counted from 0 by its sender), sent in ``round_index``."""
        ...


class Network(ABC):
    """One kind of link between agents; built from a :class:`RunConfig` by
    :func:`airgossip.emulation.networks.network_for`."""

    #: Registry key (``static``, ``wireless``).
    kind: ClassVar[str]
    #: The graph or the links change with time: a fleet needs a clock to run it.
    time_varying: ClassVar[bool]

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.scheme = algorithm_class(config.algorithm).mixing
        self._told_cs_plus = False

    @property
    def round_driven(self) -> bool:
        """The graph changes from round to round (a ``[switching]`` schedule): a fleet has to
        hand the runtime every finished round (:meth:`LinkRuntime.after_round`)."""
        return False

    @property
    def compute_s(self) -> float:
        """On a virtual clock, the seconds one local step takes."""
        return 0.0

    @property
    def record(self) -> bool:
        """Whether the run keeps replay logs of the links (a runtime's ``journal``)."""
        return False

    # -- before the run ---------------------------------------------------------------------
    @abstractmethod
    def topology(self) -> TopologySpec:
        """What a coordinator hands out at the start."""

    @abstractmethod
    def first_graph(self) -> Graph:
        """The first gossip graph; :class:`ConfigError` if it cannot serve the algorithm."""

    @abstractmethod
    def describe(self) -> str:
        """One line for consoles and plot titles (``exponential · loss 0.1``)."""

    def message_drops(self) -> BatchedDrops | None:
        """Every message's drop verdict for whole arrays of messages, equal to the in-agent
        shaper's (None: this network decides message by message only)."""
        return None

    def launch(self, now_unix: float) -> RunConfig:
        """Launch the run at ``now_unix``: a network that runs on the wall clock fixes its
        t = 0 there (unless its config has one), in itself and in the config every agent
        shares, which it returns."""
        return self.config

    def wall_clock(self) -> Clock:
        """Seconds since the scenario's t = 0 on the wall clock (for a network with no t = 0
        stamped in its config: since this call)."""
        start = time.time()
        return lambda: time.time() - start

    def check_algorithm(self, graph: Graph) -> None:
        """:class:`ConfigError` when the algorithm cannot run on ``graph`` (dpsgd on a
        directed one, say)."""
        config = self.config
        if not supports_directed(config.algorithm) and not graph.is_undirected:
            raise ConfigError(directed_graph_refusal(config.algorithm, config.topology))
        if config.algorithm == "cs-plus-gossip" and graph.phases:
            self._check_cs_plus(graph)

    def _check_cs_plus(self, graph: Graph) -> None:
        """CS+-RG's radius is 0 for an agent whose neighbours hold no more than twice the
        insiders' weight: refuse a graph where no agent can ever mix, warn (once) naming the
        agents that cannot on one where some can. With a ``[switching]`` schedule only the
        first graph is looked at, so it only warns."""
        byzantine = CSPlusOptions.model_validate(self.config.algorithm_options).byzantine
        stranded = cs_plus_never_mixing(graph, byzantine)
        if not stranded:
            return
        degrees = graph.union().sum(axis=1)
        linked = int((degrees > 0).sum())
        counts = ", ".join(str(d) for d in sorted({int(degrees[i]) for i in stranded}))
        head = f"cs-plus-gossip with byzantine={byzantine}"
        advice = "give a denser topology or a smaller byzantine"
        if len(stranded) == linked and self.config.switching is None:
            raise ConfigError(
                f"{head}: no agent can ever mix on '{self.config.topology}' (each has too few "
                f"neighbours ({counts}) for a clipping radius above 0); {advice}"
            )
        if self._told_cs_plus:
            return
        self._told_cs_plus = True
        names = [agent_id(i) for i in stranded]
        if len(names) > 10:
            names = [*names[:10], f"and {len(names) - 10} more"]
        who = "agent %s has" if len(stranded) == 1 else "agents %s have"
        log.warning(
            "%s: " + who + " too few neighbours (%s) to ever mix (clipping radius always 0: "
            "local training only)%s; %s", head, ", ".join(names), counts,
            " on the first graph" if self.config.switching is not None else "", advice,
        )  # fmt: skip

    # -- during the run ---------------------------------------------------------------------
    @abstractmethod
    def runtime(
        self, ids: list[str], clock: Clock | None = None, *, journal: bool = False
    ) -> LinkRuntime:
        """The links as one process sees them. ``clock``: seconds since the scenario's
        start (None: the wall clock); ``journal``: keep every link verdict."""

    @abstractmethod
    def kernel_links(self) -> KernelLinks:
        """The links step by step, for a kernel link applier."""

    # -- after the run ----------------------------------------------------------------------
    @abstractmethod
    def resolved(self, graph: Graph, runtime: LinkRuntime | None = None) -> ResolvedFigures:
        """What ``results.json``'s config carries beside the settings: the figures of
        ``graph`` (the first gossip graph) and what ``runtime`` (the one that followed the
        run's graph, if any) did with it."""

    def finish(  # noqa: B027 - optional hook
        self,
        results: RunResults,
        records: dict[str, list[RoundRecord]],
        out_dir: Path,
        *,
        end_time_s: float,
        runtime: LinkRuntime | None = None,
    ) -> None:
        """Add what the network knows to ``results`` (per-round link figures, logs written
        into ``out_dir``). ``end_time_s``: when the run ended on the scenario's clock;
        ``runtime``: the fleet's own, when the agents ran in this process."""
