"""What a wireless network adds to records and results: link figures per round, replay logs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from pathlib import Path

import numpy as np

from airgossip.common.security.private_files import open_private
from airgossip.edge.observability.stats import RoundRecord, StatsSink
from airgossip.emulation.channel.model import ChannelBase
from airgossip.emulation.networks.gossip_graph import GraphEpoch, WirelessTopology
from airgossip.emulation.networks.shaper import PlannedMessage
from airgossip.scenario.results import RunResults


class LinkFiguresSink:
    """Adds the channel's figures at the time of each record to its metrics, then passes it
    on: ``radio_links`` (directed links in range), ``gossip_links`` (edges of the gossip
    graph), ``strongly_connected`` (1 or 0) and ``out_links`` (this agent's out-degree)."""

    def __init__(
        self, inner: StatsSink | None, topology: WirelessTopology, clock: Callable[[], float]
    ) -> None:
        self.inner = inner
        self.topology = topology
        self.clock = clock
        self._index = {agent_id: i for i, agent_id in enumerate(topology.ids)}
        # The latest graph's figures as metrics (every agent records in it: a fleet of 1,000
        # makes them a thousand times a round).
        self._graph: GraphEpoch | None = None
        self._figures: dict[str, float] = {}
        self._out_links: tuple[float, ...] = ()

    def record(self, record: RoundRecord) -> None:
        graph = self.topology.graph(self.clock())
        if graph is not self._graph:
            self._graph = graph
            self._figures = {
                "radio_links": float(graph.radio_links),
                "gossip_links": float(graph.gossip_links),
                "strongly_connected": float(graph.strongly_connected),
                "graph_epoch": float(graph.epoch),
            }
            self._out_links = tuple(float(d) for d in graph.out_degree)
        record.metrics.update(self._figures)
        node = self._index.get(record.agent_id)
        if node is not None:
            record.metrics["out_links"] = self._out_links[node]
        if self.inner is not None:
            self.inner.record(record)


def annotate_rounds(results: RunResults, records: Mapping[str, Iterable[RoundRecord]]) -> None:
    """Add per-round link counts and drop rates to ``results.rounds``.

    ``radio_links`` and ``gossip_links``: the fleet's links when the round was recorded
    (median over agents); ``strongly_connected``: the share of agents that saw a strongly
    connected graph; ``drop_rate``: messages lost over messages sent during that round (from
    the agents' cumulative counters).
    """
    by_round: dict[int, list[RoundRecord]] = {}
    for agent_records in records.values():
        for record in agent_records:
            by_round.setdefault(record.round, []).append(record)
    previous_sent = previous_dropped = 0
    for row in results.rounds:
        rows = by_round.get(row.round, [])
        for key, combine in (("radio_links", np.median), ("gossip_links", np.median),
                             ("strongly_connected", np.mean)):  # fmt: skip
            values = [r.metrics[key] for r in rows if key in r.metrics]
            if values:
                setattr(row, key, float(combine(values)))
        delta = row.messages_sent - previous_sent
        row.drop_rate = (row.messages_dropped - previous_dropped) / delta if delta > 0 else None
        previous_sent, previous_dropped = row.messages_sent, row.messages_dropped
    final = results.final
    if final.messages_sent:
        final.drop_rate = final.messages_dropped / final.messages_sent


def write_link_log(model: ChannelBase, ids: list[str], path: Path, until_s: float) -> int:
    """Write ``links.jsonl``: one line per model step up to ``until_s`` with node positions
    and every existing link's state (a replay log). Returns the number of steps written."""
    steps = model.step_of(until_s) + 1
    with open_private(path, "w") as handle:
        for step in range(steps):
            st = model.state(step)
            src, dst = st.link_pairs()
            line = {
                "step": step,
                "time_s": round(st.time_s, 6),
                "positions": np.round(st.positions, 3).tolist(),
                "links": {
                    "from": [ids[i] for i in src],
                    "to": [ids[j] for j in dst],
                    "rx_dbm": np.round(st.link_values("rx_dbm"), 2).tolist(),
                    "sinr_db": np.round(st.link_values("sinr_db"), 2).tolist(),
                    "rate_bps": np.round(st.link_values("rate_bps")).tolist(),
                    "goodput_bps": np.round(st.link_values("goodput_bps")).tolist(),
                    "per": [float(f"{p:.4g}") for p in st.link_values("per")],
                    "bad": st.link_values("bad").astype(int).tolist(),
                },
            }
            handle.write(json.dumps(line) + "\n")
    return steps


def write_journal(journal: Iterable[PlannedMessage], path: Path) -> None:
    with open_private(path, "w") as handle:
        for entry in journal:
            handle.write(json.dumps(asdict(entry)) + "\n")
