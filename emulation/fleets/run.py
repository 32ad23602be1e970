"""Run a fleet to the end: check the run, pick the fleet of its mode and the network of its
links, run, and write ``results.json`` and the plot."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edge.config.settings import resolve_device
from edge.observability.stats import RoundRecord
from edge.tasks import TaskContext, TaskError, load_task
from edge.tasks.consensus import ConsensusOptions, true_average
from edge.topology import Graph
from emulation.config import ConfigError, RunConfig
from emulation.fleets.base import Fleet, FleetError, Launch, ProgressCallback
from emulation.fleets.registry import fleet_class
from emulation.networks import LinkRuntime, Network, network_for
from emulation.privacy import check_privacy, privacy_figures
from emulation.results import RunResults, plot_results, summarise

#: What a run leaves in its output folder: a second run there would mix the two.
RUN_OUTPUTS = ("results.json", "agents", "logs")


@dataclass(frozen=True)
class Plan:
    """A run checked before anything starts: its fleet, network and first gossip graph."""

    config: RunConfig
    fleet: type[Fleet]
    network: Network
    graph: Graph


def preflight(config: RunConfig) -> Plan:
    """Check everything that can be checked before any agent starts (the mode serves the
    network, the graph fits the algorithm, the task loads); :class:`ConfigError` if not."""
    fleet = fleet_class(config.mode)
    network = network_for(config)
    refusal = fleet.refuse(config, network)
    if refusal is not None:
        raise ConfigError(refusal)
    graph = network.first_graph()
    try:
        device = resolve_device(config.device)
        settings = config.agent_settings()
        task = load_task(
            settings.task.name,
            TaskContext(0, config.agents, config.seed, device, settings.task.options),
        )
        check_privacy(config, network, task)
    except (TaskError, ValueError) as err:
        raise ConfigError(str(err)) from None
    return Plan(config, fleet, network, graph)


def reference_answer(config: RunConfig) -> np.ndarray | None:
    """The exact average for ``consensus`` runs, computed independently of the agents."""
    if config.task.name != "consensus":
        return None
    options = ConsensusOptions.model_validate(config.task.options)
    return true_average(config.seed, config.agents, options).numpy()


def refuse_used_out_dir(out_dir: Path) -> None:
    """``ConfigError`` if ``out_dir`` already holds a run's results or agent files."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"output folder {out_dir} exists and is not a folder")
    used = [name for name in RUN_OUTPUTS if (out_dir / name).exists()]
    if used:
        raise ConfigError(
            f"output folder {out_dir} already holds a run ({', '.join(used)}); "
            "choose a new --out or remove it"
        )


def write_results(
    config: RunConfig,
    network: Network,
    records: dict[str, list[RoundRecord]],
    out_dir: Path,
    *,
    resolved: dict[str, Any],
    wall_s: float,
    interrupted: bool,
    end_time_s: float,
    runtime: LinkRuntime | None = None,
    links: str | None = None,
) -> RunResults:
    """Summarise every agent's round records into ``results.json`` and ``results.png`` in
    ``out_dir``, whoever ran the agents (a fleet here, or a coordinator that collected them).

    ``resolved``: the config the results carry; ``links``: what the links were, for the
    plot's title (default: the network's own description).
    """
    results = summarise(records, reference=reference_answer(config), config=resolved)
    results.total_wall_s = round(wall_s, 3)
    results.interrupted = interrupted
    results.versions = {"torch": torch.__version__, "python": sys.version.split()[0]}
    privacy = privacy_figures(config, network, records)
    if privacy is not None:  # a figure a run does not have stays out of the file
        results.privacy = privacy
    network.finish(results, records, out_dir, end_time_s=end_time_s, runtime=runtime)
    results.write(out_dir / "results.json")
    if results.rounds:
        title = (
            f"{config.task.name} · {config.agents} agents · {links or network.describe()} · "
            f"{config.algorithm}"
        )
        plot_results(out_dir / "results.png", results, title)
    return results


def run_fleet(
    config: RunConfig,
    out_dir: Path,
    *,
    on_progress: ProgressCallback | None = None,
    coordinator_listen: str = "127.0.0.1:0",
    coordinator_metrics_listen: str | None = None,
    on_start: Callable[[Fleet], None] | None = None,
    plan: Plan | None = None,
    on_notice: Callable[[str], None] | None = None,
    insecure: bool = False,
) -> RunResults:
    """Run a fleet to the end; write ``results.json`` and ``results.png`` into ``out_dir``.

    ``on_start`` gets the fleet once it is built (to stop it from elsewhere, say). On
    Ctrl-C the agents are stopped, whatever was recorded so far is written with
    ``"interrupted": true``, and ``KeyboardInterrupt`` propagates. ``plan``: the
    :func:`preflight` of ``config`` when the caller already made it; ``on_notice`` gets
    what the fleet says people should know (what a kernel could not apply, say).
    ``insecure``: agents that talk over the network do so in plaintext (default: mutual TLS,
    see :class:`~emulation.fleets.base.Launch`).
    """
    plan = plan if plan is not None and plan.config == config else preflight(config)
    if insecure and config.privacy.mechanism == "cancelling" and not plan.fleet.in_process:
        raise ConfigError(
            "privacy mechanism 'cancelling' needs every agent's identity to agree a key with "
            "each partner: run without --insecure (mutual TLS), or in one process (--mode "
            "inproc or virtual)"
        )
    refuse_used_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = plan.network.launch_config(time.time())
    network = network_for(config)
    config_path = out_dir / "config.json"
    config_path.write_text(json.dumps(config.model_dump(mode="json"), indent=2) + "\n")
    launch = Launch(
        out_dir, config_path, on_progress, coordinator_listen, coordinator_metrics_listen,
        on_notice, insecure,
    )  # fmt: skip
    started = time.monotonic()
    fleet = plan.fleet(config, network, launch)
    if on_start is not None:
        on_start(fleet)
    interrupted = False
    try:
        fleet.run()
    except KeyboardInterrupt:
        interrupted = True
    except TaskError as err:  # a task failing in this process (a user's app, say)
        raise FleetError(str(err)) from None
    results = write_results(
        config, network, fleet.records(), out_dir,
        resolved=network.resolved(plan.graph), wall_s=time.monotonic() - started,
        interrupted=interrupted, end_time_s=fleet.clock_s(), runtime=fleet.runtime,
    )  # fmt: skip
    if interrupted:
        raise KeyboardInterrupt
    return results
