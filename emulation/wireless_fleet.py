"""Glue between wireless scenarios and the fleet launchers (all backends).

Checks a scenario before anything starts, builds what an agent process needs (shaper,
graph follower, figures sink), and finishes ``results.json`` with per-round link counts,
drop rates and, with ``record = true``, the replay logs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edge.agent import Agent
from edge.stats import RoundRecord, StatsSink
from edge.telemetry import LinkFigures
from edge.topology import mixing_matrices, second_largest_eigenvalue
from edge.topology.graphs import Graph
from emulation.channel.model import strongly_connected
from emulation.config import ConfigError, RunConfig
from emulation.scenario import WirelessSettings
from emulation.traces import TraceError
from emulation.wireless import (
    LinkFiguresSink,
    WirelessLinkShaper,
    WirelessRun,
    annotate_rounds,
    link_record,
    write_journal,
    write_link_log,
)

log = logging.getLogger(__name__)

#: Fleets up to this size get the mixing |lambda2| of their first gossip graph in results.
LAMBDA2_LIMIT = 256


def fleet_ids(count: int) -> list[str]:
    return [f"agent-{i}" for i in range(count)]


def check_wireless(config: RunConfig) -> Graph | None:
    """Everything about a wireless scenario that can fail before agents start; return the
    first gossip graph (None without a scenario)."""
    if config.wireless is None:
        if config.mode in ("virtual", "namespaces"):
            raise ConfigError(
                f"mode '{config.mode}' needs a wireless scenario (--scenario NAME|FILE)"
            )
        return None
    from edge.algorithms import ALGORITHMS

    if not ALGORITHMS[config.algorithm].supports_directed:
        raise ConfigError(
            f"algorithm '{config.algorithm}' needs an undirected graph; wireless links are directed"
        )
    try:
        run = WirelessRun(config.wireless, fleet_ids(config.agents), config.seed, lambda: 0.0)
        first = run.topology.graph(0.0)
    except (TraceError, ValueError) as err:
        raise ConfigError(f"bad wireless scenario: {err}") from None
    return Graph(f"wireless:{config.wireless.name}", (first.adjacency,))


def with_epoch(config: RunConfig) -> RunConfig:
    """Stamp the scenario's t = 0 on the wall clock (agents of a real-time run share it)."""
    if config.wireless is None or config.wireless.epoch_unix is not None:
        return config
    wireless = config.wireless.model_copy(update={"epoch_unix": time.time()})
    return config.model_copy(update={"wireless": wireless})


def wireless_resolved(config: RunConfig, graph: Graph) -> dict[str, Any]:
    """The resolved config of a wireless run, with the figures of its first gossip graph
    (``graph``, from :func:`check_wireless`)."""
    assert config.wireless is not None
    adjacency = graph.phases[0]
    resolved: dict[str, Any] = config.model_dump(mode="json")
    resolved["topology"] = graph.name
    resolved["lambda2"] = None
    if config.agents <= LAMBDA2_LIMIT:  # a dense eigenvalue problem: small fleets only
        resolved["lambda2"] = second_largest_eigenvalue(mixing_matrices(graph))
    resolved["topology_period"] = None
    resolved["edges_per_round"] = int(adjacency.sum())
    connected, _ = strongly_connected(adjacency)
    resolved["initial_strongly_connected"] = connected
    return resolved


def finish_results(
    results: dict[str, Any],
    records: dict[str, list[RoundRecord]],
    config: RunConfig,
    out_dir: Path,
    *,
    end_time_s: float,
    run: WirelessRun | None = None,
) -> None:
    """Per-round link figures into ``results``; replay logs when the scenario records."""
    assert config.wireless is not None
    annotate_rounds(results, records)
    rows = [r for r in results["rounds"] if r.get("gossip_links") is not None]
    results["wireless"] = {
        "scenario": config.wireless.name,
        "emulated_s": round(end_time_s, 3),
        "graph_epochs": int(
            max((r.metrics.get("graph_epoch", 0) for rs in records.values() for r in rs), default=0)
        ),
        "mean_radio_links": float(np.mean([r["radio_links"] for r in rows])) if rows else None,
        "mean_gossip_links": float(np.mean([r["gossip_links"] for r in rows])) if rows else None,
        "strongly_connected_share": float(np.mean([r["strongly_connected"] for r in rows]))
        if rows
        else None,
    }
    if config.wireless.record:
        ids = fleet_ids(config.agents)
        run = run or WirelessRun(config.wireless, ids, config.seed, lambda: 0.0)
        steps = write_link_log(run.model, ids, out_dir / "links.jsonl", end_time_s)
        results["wireless"]["links_log"] = "links.jsonl"
        results["wireless"]["links_log_steps"] = steps
        if run.shaper.journal is not None:
            write_journal(run.shaper.journal, out_dir / "messages.jsonl")
            results["wireless"]["messages_log"] = "messages.jsonl"


class WirelessAgent:
    """What one real-time agent process (gRPC, or in a namespace) runs of a scenario."""

    def __init__(
        self, settings: WirelessSettings, ids: list[str], agent_id: str, seed: int
    ) -> None:
        epoch = settings.epoch_unix if settings.epoch_unix is not None else time.time()
        self.epoch = epoch
        self.run = WirelessRun(settings, ids, seed, self.clock)
        self.agent_id = agent_id
        self.node = ids.index(agent_id)
        self._thread: threading.Thread | None = None

    def clock(self) -> float:
        return time.time() - self.epoch

    def shaper(self, mode: str) -> WirelessLinkShaper | None:
        """The in-agent shaper; none in namespaces, where the kernel shapes the links."""
        return None if mode == "namespaces" else self.run.shaper

    def sink(self, inner: StatsSink | None) -> StatsSink:
        return LinkFiguresSink(inner, self.run.topology, self.clock)

    def link_figures(self) -> list[LinkFigures]:
        """This agent's out-links now (those in range, and its gossip out-neighbours)."""
        t = self.clock()
        state = self.run.model.at(t)
        gossip = self.run.topology.graph(t).adjacency[self.node]
        ids = self.run.topology.ids
        records = [
            link_record(state, ids, self.node, j)
            for j in range(len(ids))
            if j != self.node and (state.exists[self.node, j] or gossip[j])
        ]
        return [
            LinkFigures(r.receiver, r.exists, r.sinr_db, r.rate_bps, r.error_rate, r.bad)
            for r in records
        ]

    def follow(
        self,
        agent: Agent,
        stop: threading.Event,
        on_links: Callable[[list[LinkFigures]], None] | None = None,
    ) -> None:
        """Install the current gossip graph now, then again whenever it changes; hand the
        radio figures of this agent's out-links to ``on_links`` as they change."""
        assignment = agent.assignment
        peers = dict(assignment.peers) if assignment is not None else {}
        peers.pop(self.agent_id, None)
        topology = self.run.topology
        current: dict[str, Any] = {"epoch": None, "assignment": None}

        def install() -> None:
            graph = topology.graph(self.clock())
            # Re-install too when something else (a coordinator update) replaced ours.
            if current["epoch"] != graph.epoch or agent.assignment is not current["assignment"]:
                new = topology.assignment(graph, self.node, peers)
                agent.set_assignment(new)
                current.update(epoch=graph.epoch, assignment=new)

        install()

        def loop() -> None:
            while not stop.wait(min(0.2, topology.interval_s / 4)):
                try:
                    install()
                    if on_links is not None:
                        on_links(self.link_figures())
                except Exception:  # the follower must not die silently mid-run
                    log.exception("wireless graph update failed")

        self._thread = threading.Thread(target=loop, name="wireless-graph", daemon=True)
        self._thread.start()
