"""The time-varying directed gossip graph that comes out of a wireless channel model."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from airgossip.common.topology import Assignment, Phase, adjacency_row, transposed
from airgossip.common.topology.graphs import Adjacency
from airgossip.emulation.channel.model import ChannelBase, gossip_adjacency, strongly_connected


@dataclass(frozen=True)
class GraphEpoch:
    """The gossip graph derived from the channel for one graph interval."""

    epoch: int
    time_s: float
    #: Dense ``(n, n)``, or a sparse CSR array above ``SPARSE_LIMIT`` nodes.
    adjacency: Adjacency
    radio_links: int
    strongly_connected: bool
    components: int
    gossip_links: int = 0
    out_degree: tuple[int, ...] = ()

    def out_of(self, node: int) -> np.ndarray:
        """The nodes ``node`` sends to, ascending."""
        return adjacency_row(self.adjacency, node)

    def into(self, node: int) -> np.ndarray:
        """The nodes that send to ``node``, ascending."""
        return adjacency_row(self._incoming, node)

    @cached_property
    def _incoming(self) -> Adjacency:
        """The adjacency reversed, made once (a sparse one by rows: each node's senders)."""
        return transposed(self.adjacency)


class WirelessTopology:
    """The time-varying directed gossip graph that comes out of the channel model.

    Every ``graph_interval_s`` the graph is rebuilt from the link state at that time (each
    node's strongest existing links, made strongly connected where the radio allows) and
    handed to agents as an :class:`Assignment` with a higher epoch.
    """

    def __init__(self, model: ChannelBase, ids: list[str]) -> None:
        self.model = model
        self.ids = list(ids)
        self.interval_s = model.settings.graph_interval_s
        self._epochs: dict[int, GraphEpoch] = {}
        self._lock = threading.Lock()

    def epoch_index(self, time_s: float) -> int:
        return max(0, math.floor(time_s / self.interval_s + 1e-9))

    def graph(self, time_s: float) -> GraphEpoch:
        k = self.epoch_index(time_s)
        with self._lock:
            cached = self._epochs.get(k)
            if cached is None:
                start = k * self.interval_s
                state = self.model.graph_state(start)
                settings = self.model.settings
                adjacency = gossip_adjacency(
                    state,
                    settings.max_out_degree,
                    settings.gossip_margin_db,
                    self.model.sensitivity_dbm,
                )
                connected, count = strongly_connected(adjacency)
                cached = GraphEpoch(
                    k + 1, start, adjacency, state.link_count(), connected, count,
                    int(adjacency.sum()), tuple(int(d) for d in adjacency.sum(axis=1)),
                )  # fmt: skip
                self._epochs = {e: g for e, g in self._epochs.items() if e >= k - 2}
                self._epochs[k] = cached
            return cached

    def assignment(self, graph: GraphEpoch, node: int, peers: dict[str, str]) -> Assignment:
        """Node ``node``'s assignment for ``graph``: its column of the column-stochastic mixing
        matrix (``1 / (d_out + 1)``) and every fleet member as a known peer (so a message from
        a former neighbour still in flight is accepted)."""
        out, incoming = graph.out_of(node), graph.into(node)
        weight = 1.0 / (len(out) + 1)
        phase = Phase(
            weight, {self.ids[j]: weight for j in out}, tuple(self.ids[j] for j in incoming)
        )
        # One directory shared by every assignment (agents only read it): 1,000 agents do
        # not need 1,000 copies of it per graph change.
        return Assignment(graph.epoch, peers, (phase,))
