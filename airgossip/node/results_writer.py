"""A run's results, whoever ran its agents (a fleet here, or a coordinator that collected
their reports): the config ``results.json`` carries, the fleet figures written with the plot,
and what the links were in words."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pydantic import JsonValue

from airgossip.common.security.private_files import private_folder
from airgossip.edge.observability.stats import RoundRecord
from airgossip.edge.tasks.consensus import ConsensusOptions, true_average
from airgossip.node.network import LinkRuntime, Network
from airgossip.node.privacy import privacy_figures
from airgossip.scenario.config import RunConfig
from airgossip.scenario.results import (
    KernelFigures,
    ResolvedFigures,
    RunResults,
    plot_results,
    summarise,
)


@dataclass(frozen=True)
class ResultsConfig:
    """What ``results.json``'s ``config`` holds: the run's settings, what the run resolved
    (its first graph's figures, the rounds a schedule switched at) and, where the agents
    were not run by a fleet of its mode (started by hand: ``devices``), who ran them.

    The JSON is flat, as it always was: the settings with the figures beside them (a
    figure's ``topology`` names the graph the run had in place of the setting's)."""

    settings: RunConfig
    resolved: ResolvedFigures
    mode: str | None = None

    def to_json(self) -> dict[str, JsonValue]:
        """The ``config`` object of ``results.json``."""
        data: dict[str, JsonValue] = self.settings.model_dump(mode="json")
        if self.settings.switching is None:
            data.pop("switching")  # a run without a schedule reads as it always did
        if self.mode is not None:
            data["mode"] = self.mode
        data.update(self.resolved.model_dump(mode="json", exclude_unset=True))
        return data


def reference_answer(config: RunConfig) -> np.ndarray | None:
    """The exact average for ``consensus`` runs, computed independently of the agents."""
    if config.task.name != "consensus":
        return None
    options = ConsensusOptions.model_validate(config.task.options)
    return true_average(config.seed, config.agents, options).numpy()


def write_results(
    network: Network,
    records: Mapping[str, list[RoundRecord]],
    out_dir: Path,
    *,
    config: ResultsConfig,
    wall_s: float,
    interrupted: bool,
    end_time_s: float,
    runtime: LinkRuntime | None = None,
    links: str | None = None,
    kernel: KernelFigures | None = None,
) -> RunResults:
    """Summarise every agent's round records into ``results.json`` and ``results.png`` in
    ``out_dir``.

    ``config``: what the results carry as their config; ``end_time_s``: when the run ended
    on the scenario's clock; ``runtime``: the links the fleet (or coordinator) followed;
    ``links``: what the links were, for the plot's title (default: the network's own
    description); ``kernel``: the packet drops of kernel-shaped links.
    """
    settings = config.settings
    results = summarise(records, reference=reference_answer(settings), config=config.to_json())
    results.total_wall_s = round(wall_s, 3)
    results.interrupted = interrupted
    results.versions = {"torch": torch.__version__, "python": sys.version.split()[0]}
    privacy = privacy_figures(settings, network, records)
    if privacy is not None:  # a figure a run does not have stays out of the file
        results.privacy = privacy
    if kernel is not None:
        results.kernel = kernel
    private_folder(out_dir)  # a coordinator's out folder, made by whoever started it
    network.finish(results, dict(records), out_dir, end_time_s=end_time_s, runtime=runtime)
    results.write(out_dir / "results.json")
    if results.rounds:
        title = (
            f"{settings.task.name} · {settings.agents} agents · "
            f"{links or network.describe()} · {settings.algorithm}"
        )
        plot_results(out_dir / "results.png", results, title)
    return results


def links_label(config: RunConfig, network: Network, topology: str) -> str:
    """What the links of agents on real links are, in words: real unless the scenario
    emulates something (``topology``: the graph the coordinator hands out)."""
    if config.wireless is not None:
        return network.describe()
    if config.switching is not None and topology == config.topology:
        topology = " → ".join(config.switching.topologies)
    if not config.emulates_links:
        return f"{topology} · real links"
    n = config.network
    emulated = [
        (n.loss, f"loss {n.loss:g}"),
        (n.latency_ms, f"latency {n.latency_ms:g} ms"),
        (n.jitter_ms, f"jitter {n.jitter_ms:g} ms"),
        (n.bandwidth_mbps, f"rate {n.bandwidth_mbps:g} Mb/s"),
    ]
    return f"{topology} · emulated " + ", ".join(text for value, text in emulated if value)
