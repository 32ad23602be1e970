"""Topology policies: which directed graph the coordinator assigns over the agents alive.

A policy turns the set of live agents (and the graph assigned so far) into the next graph:

* :class:`StaticPolicy`: a named topology from the scenario over the fleet as it was when
  released. A dead agent is *spliced out* (each of its in-neighbours gets an edge to each of
  its out-neighbours), which keeps every path that went through it, so the survivors' graph
  stays strongly connected; a returning agent gets its original edges back.
* :class:`EdgeListPolicy`: an explicit edge list, from the scenario or replaced at run time
  (:meth:`EdgeListPolicy.set_edges`, fed by an emulator); dead agents are spliced out too.
* :class:`KOutPolicy`: every agent sends to ``k`` random peers; joins are wired in by
  inserting the newcomer into random existing edges, failures are rewired around the dead
  agent, and a final pass joins any strongly connected components into one.
* :class:`SwitchingPolicy`: the graphs of a ``[switching]`` schedule, one after the other
  (the :class:`~airgossip.common.topology.TopologySwitcher` decides when, from the fleet's reports),
  each over the fleet at release with dead agents spliced out as in :class:`StaticPolicy`.
* :class:`OnePeerExponentialPolicy`: the time-varying one-peer exponential schedule, rebuilt
  over the live agents in natural order whenever they change.

Policies are pure apart from their small persistent state (:meth:`TopologyPolicy.state`):
every random draw derives from the policy's seed and the epoch, so the same sequence of
events gives the same graphs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from airgossip.common.topology import (
    TOPOLOGIES,
    Graph,
    TopologyError,
    TopologySwitcher,
    build_graph,
)
from airgossip.coordinator.graphs import (
    FleetGraph,
    from_edges,
    join_components,
    restrict,
    splice_out,
)
from airgossip.coordinator.run import JsonValue

#: Coordinator topologies: the scenario's named ones plus the dynamic k-out graph.
POLICIES = (*TOPOLOGIES, "k-out")


class _TopologyIdentity(TypedDict):
    name: str
    seed: int


class TopologyDescription(_TopologyIdentity, total=False):
    """What identifies a topology, as stored with a fleet and compared on restart (only the
    keys that apply to it)."""

    edges: list[list[int]]
    p: float | None
    out_degree: int
    scheme: str
    #: A ``[switching]`` schedule, as its settings' JSON.
    switching: dict[str, JsonValue]


class PolicyState(TypedDict, total=False):
    """What a policy remembers across a coordinator restart (only the keys it uses)."""

    #: The fleet at release, in natural order.
    universe: list[str]
    #: An edge list set at run time, as ``[from, to]`` ids.
    edges: list[list[str]]
    #: Rounds after which a ``[switching]`` schedule moved on.
    switched_at: list[int]


@dataclass(frozen=True)
class TopologySpec:
    """The topology the coordinator maintains.

    Attributes
    ----------
    name:
        One of :data:`POLICIES`.
    seed:
        Seed of random graphs (``erdos-renyi``, ``k-out``).
    edges:
        ``(from, to)`` node indices for ``edges`` (nodes in natural order of the ids).
    p:
        Edge probability for ``erdos-renyi``.
    out_degree:
        ``k`` of ``k-out``.
    scheme:
        Mixing weights the fleet's algorithm needs (``metropolis-hastings`` for dpsgd, choco).
    """

    name: str = "exponential"
    seed: int = 0
    edges: tuple[tuple[int, int], ...] = ()
    p: float | None = None
    out_degree: int = 2
    scheme: str = "column-stochastic"

    def graph(self, n: int) -> Graph:
        """The named static topology on ``n`` nodes (``TopologyError`` if it cannot be built;
        ``k-out`` and the other policies that edit their graph have no such graph)."""
        return build_graph(self.name, n, seed=self.seed, edges=list(self.edges) or None, p=self.p)

    def describe(self) -> TopologyDescription:
        """What identifies the topology (stored with a fleet, compared on restart)."""
        data: TopologyDescription = {"name": self.name, "seed": self.seed}
        if self.name == "edges":
            data["edges"] = [list(e) for e in self.edges]
        if self.name == "erdos-renyi":
            data["p"] = self.p
        if self.name == "k-out":
            data["out_degree"] = self.out_degree
        if self.scheme != "column-stochastic":
            data["scheme"] = self.scheme
        return data


class TopologyPolicy(ABC):
    """Turns the live agents into the graph to assign."""

    #: Whether agents that were not in the fleet at release may join later.
    open_membership: bool = False
    #: The decider of a graph schedule the fleet follows (None: the graph changes only
    #: with membership).
    switcher: TopologySwitcher | None = None

    def __init__(self, spec: TopologySpec) -> None:
        self.spec = spec

    @abstractmethod
    def graph(self, alive: Sequence[str], current: FleetGraph | None, epoch: int) -> FleetGraph:
        """The graph over ``alive`` (in natural order) for ``epoch``.

        Parameters
        ----------
        alive:
            Live agent ids, in natural order; at least one.
        current:
            The graph assigned so far (None at release).
        epoch:
            The epoch the graph is for (seeds random choices).
        """

    def admits(self, agent_id: str) -> bool:
        """Whether ``agent_id`` may (re)join once the fleet is released."""
        return self.open_membership

    def describe(self) -> TopologyDescription:
        """What identifies the topology (stored with a fleet, compared on restart)."""
        return self.spec.describe()

    def state(self) -> PolicyState:
        """What the policy must remember across a coordinator restart."""
        return {}

    def restore(self, state: PolicyState) -> None:  # noqa: B027 - optional hook
        """Take back :meth:`state` after a restart."""


class StaticPolicy(TopologyPolicy):
    """A named topology over the fleet at release; dead agents spliced out, returners back."""

    def __init__(self, spec: TopologySpec) -> None:
        super().__init__(spec)
        self.universe: tuple[str, ...] = ()
        self._base: Graph | None = None

    def base(self) -> Graph:
        if self._base is None:
            self._base = self.spec.graph(len(self.universe))
        return self._base

    def admits(self, agent_id: str) -> bool:
        return agent_id in self.universe

    def graph(self, alive: Sequence[str], current: FleetGraph | None, epoch: int) -> FleetGraph:
        if not self.universe:
            self.universe = tuple(alive)
        base = self.base()
        phases = []
        for a in base.phases:
            a = a.copy()
            for node, agent_id in enumerate(self.universe):
                if agent_id not in alive:
                    splice_out(a, node)
            phases.append(restrict(a, self.universe, alive))
        return FleetGraph(tuple(alive), Graph(name=base.name, phases=tuple(phases)))

    def state(self) -> PolicyState:
        return {"universe": list(self.universe)}

    def restore(self, state: PolicyState) -> None:
        self.universe = tuple(state.get("universe", ()))
        self._base = None


class EdgeListPolicy(StaticPolicy):
    """An explicit edge list over the fleet, replaceable at run time by :meth:`set_edges`."""

    def __init__(self, spec: TopologySpec) -> None:
        super().__init__(spec)
        self._pairs: list[tuple[str, str]] | None = None

    def base(self) -> Graph:
        if self._pairs is None:
            return super().base()
        if self._base is None:
            self._base = from_edges("edges", self.universe, [self._pairs]).graph
        return self._base

    def set_edges(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Replace the edge list; ids must belong to the fleet (raises ``TopologyError``)."""
        if not self.universe:
            raise TopologyError("the fleet is not complete yet: no edge list can be set")
        checked = []
        for u, v in pairs:
            for agent_id in (u, v):
                if agent_id not in self.universe:
                    raise TopologyError(
                        f"edge {u}->{v} names '{agent_id}', which is not in the fleet"
                    )
            if u == v:
                raise TopologyError(f"edge {u}->{v} is a self loop; self weights are implicit")
            checked.append((u, v))
        self._pairs = checked
        self._base = None

    def state(self) -> PolicyState:
        data = super().state()
        if self._pairs is not None:
            data["edges"] = [list(p) for p in self._pairs]
        return data

    def restore(self, state: PolicyState) -> None:
        super().restore(state)
        edges = state.get("edges")
        self._pairs = [(str(u), str(v)) for u, v in edges] if edges is not None else None


class SwitchingPolicy(StaticPolicy):
    """The graph a ``[switching]`` schedule is on now, over the fleet at release; dead agents
    spliced out, returners back.

    The fleet moves the ``switcher`` on from its round reports and rebuilds; the stage
    reached is policy state, so a coordinator restarted from its database goes on from the
    graph it had switched to.
    """

    def __init__(self, spec: TopologySpec, switcher: TopologySwitcher) -> None:
        first = switcher.settings.topologies[0]
        if spec.name != first:
            raise TopologyError(
                f"the run starts on the first topology of [switching], '{first}', and the "
                f"coordinator's topology is '{spec.name}'; leave the topology out or make "
                "them agree"
            )
        super().__init__(spec)
        self.switcher = self.schedule = switcher

    def base(self) -> Graph:
        graph = self.schedule.graph
        if graph.n != len(self.universe):
            raise TopologyError(
                f"[switching] builds its graphs over {graph.n} agents, and the fleet released "
                f"with {len(self.universe)}"
            )
        return graph

    def describe(self) -> TopologyDescription:
        data = super().describe()
        data["switching"] = self.schedule.settings.model_dump(mode="json")
        return data

    def state(self) -> PolicyState:
        data = super().state()
        data["switched_at"] = list(self.schedule.switched_at)
        return data

    def restore(self, state: PolicyState) -> None:
        super().restore(state)
        try:
            self.schedule.restore(state.get("switched_at", []))
        except (TypeError, ValueError) as err:
            raise TopologyError(f"stored [switching] state: {err}") from None


class OnePeerExponentialPolicy(TopologyPolicy):
    """The one-peer exponential schedule over whoever is alive, in natural order."""

    open_membership = True

    def graph(self, alive: Sequence[str], current: FleetGraph | None, epoch: int) -> FleetGraph:
        return FleetGraph(tuple(alive), build_graph("one-peer-exponential", len(alive)))


class KOutPolicy(TopologyPolicy):
    """Every agent sends to ``k`` random peers; kept strongly connected through churn."""

    open_membership = True

    def __init__(self, spec: TopologySpec) -> None:
        if spec.out_degree < 1:
            raise TopologyError(f"k-out needs an out-degree of at least 1, got {spec.out_degree}")
        super().__init__(spec)

    def graph(self, alive: Sequence[str], current: FleetGraph | None, epoch: int) -> FleetGraph:
        rng = np.random.default_rng([self.spec.seed, epoch])
        k = self.spec.out_degree
        old = list(current.ids) if current is not None else []
        ids = old + [agent_id for agent_id in alive if agent_id not in old]
        n = len(ids)
        a = np.zeros((n, n), dtype=bool)
        if current is not None:
            a[: len(old), : len(old)] = current.graph.union()
        # Failures first: each in-neighbour of a dead agent takes over one of its out-edges
        # (possibly to another dead agent, which is rewired in turn).
        for node, agent_id in enumerate(ids):
            if agent_id in alive:
                continue
            targets = [int(w) for w in np.flatnonzero(a[node])]
            for u in np.flatnonzero(a[:, node]):
                a[u, node] = False
                options = [w for w in targets if w != u and not a[u, w]]
                if options:
                    a[u, int(rng.choice(options))] = True
            a[node, :] = False
        # Joins: the newcomer cuts into random existing edges u->w, becoming u->new->w.
        present = [i for i, agent_id in enumerate(ids[: len(old)]) if agent_id in alive]
        for node in range(len(old), n):
            hosts = [u for u in present if a[u].any()]
            for host in rng.permutation(hosts)[:k] if hosts else []:
                w = int(rng.choice(np.flatnonzero(a[host])))
                a[host, w] = False
                a[host, node] = True
                a[node, w] = True
            present.append(node)
        a = restrict(a, ids, alive)
        # Top every agent up to k out-neighbours (fewer when the fleet is smaller).
        m = len(alive)
        for src in range(m):
            missing = min(k, m - 1) - int(a[src].sum())
            if missing > 0:
                options = [w for w in range(m) if w != src and not a[src, w]]
                for w in rng.choice(options, size=missing, replace=False):
                    a[src, int(w)] = True
        join_components(a, rng)
        return FleetGraph(tuple(alive), Graph(name="k-out", phases=(a,)))


def make_policy(spec: TopologySpec, switcher: TopologySwitcher | None = None) -> TopologyPolicy:
    """The policy for ``spec.name``, or for the graph schedule of ``switcher`` (which starts
    on ``spec.name``); ``TopologyError`` for an unknown name or bad arguments."""
    if switcher is not None:
        return SwitchingPolicy(spec, switcher)
    if spec.name == "k-out":
        return KOutPolicy(spec)
    if spec.name == "one-peer-exponential":
        return OnePeerExponentialPolicy(spec)
    if spec.name == "edges":
        if not spec.edges:
            raise TopologyError(
                "topology 'edges' needs an edge list (e.g. edges = [[0, 1], [1, 0]])"
            )
        return EdgeListPolicy(spec)
    if spec.name in TOPOLOGIES:
        return StaticPolicy(spec)
    raise TopologyError(f"unknown topology '{spec.name}'; choose one of: {', '.join(POLICIES)}")
