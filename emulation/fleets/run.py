"""Run a fleet to the end: check the run, pick the fleet of its mode and the network of its
links, run, and write ``results.json`` and the plot."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from airgossip.common.topology import Graph
from airgossip.edge.privacy.settings import PrivacySettings
from airgossip.edge.settings import resolve_device
from airgossip.edge.tasks import TaskContext, TaskError, load_task
from airgossip.emulation.fleets.base import Fleet, FleetError, Launch, ProgressCallback
from airgossip.emulation.fleets.registry import fleet_class
from airgossip.emulation.networks import Network, network_for
from airgossip.emulation.networks.kernel import ContainerKernelReport, NamespaceKernelReport
from airgossip.node.folder import RunFolder
from airgossip.node.privacy import check_privacy
from airgossip.node.results_writer import ResultsConfig, write_results
from airgossip.scenario.config import ConfigError, RunConfig
from airgossip.scenario.results import KernelFigures, RunResults

log = logging.getLogger(__name__)

#: How long an agent on kernel-shaped links (a mode whose ``links_in_kernel`` is set: loss is a
#: packet drop rate there, and TCP resends) waits for its sends before its next round (the
#: default ``wait_timeout_s`` there; 0.25 s elsewhere). TCP resends a dropped packet after
#: 0.2 s at the least, doubling each time, so with loss most rounds have a send still in
#: flight after 0.25 s; an agent that moved on would skip that out-neighbour in its next
#: round (one message in flight per edge) and the fleet would send fewer messages than in
#: process mode. Waiting keeps the count of every mode the same.
KERNEL_WAIT_TIMEOUT_S = 5.0


def kernel_figures(fleet: Fleet) -> KernelFigures | None:
    """The packet drops a kernel-shaping fleet measured (``kernel.json``), or None."""
    report = getattr(fleet, "report", None)
    if not isinstance(report, NamespaceKernelReport | ContainerKernelReport):
        return None
    seen = sum(link.packets_seen for link in report.links)
    dropped = sum(link.packets_dropped for link in report.links)
    return KernelFigures(
        packets_seen=seen, packets_dropped=dropped,
        drop_rate=round(dropped / seen, 6) if seen else None, links=len(report.links),
    )  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """A run checked before anything starts: its fleet, network and first gossip graph, and
    its ``[privacy]`` with the noise resolved (what every agent is handed)."""

    config: RunConfig
    fleet: type[Fleet]
    network: Network
    graph: Graph
    privacy: PrivacySettings | None = None


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
        privacy = check_privacy(config, network, task).privacy
    except (TaskError, ValueError) as err:
        raise ConfigError(str(err)) from None
    return Plan(config, fleet, network, graph, privacy)


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
    see :class:`~airgossip.emulation.fleets.base.Launch`).
    """
    plan = plan if plan is not None and plan.config == config else preflight(config)
    mechanism = config.privacy.mechanism
    if insecure and mechanism.pair_secrets and not plan.fleet.in_process:
        raise ConfigError(
            f"privacy mechanism '{mechanism}' needs every agent's identity to agree a key with "
            "each partner: run without --insecure (mutual TLS), or in one process (--mode "
            "inproc or virtual)"
        )
    if config.device_classes and not plan.fleet.emulates_devices and on_notice is not None:
        on_notice(
            f"mode '{config.mode}' has no clock to emulate [[device_classes]] on: every agent "
            "computes at this machine's speed and no energy is accounted (--mode virtual or "
            "process emulate them)"
        )
    folder = RunFolder(out_dir)
    folder.refuse_used()
    network = plan.network
    config = network.launch(time.time())
    if plan.privacy is not None:  # the noise resolved once, for every agent and the figures
        config = config.model_copy(update={"privacy": plan.privacy})
    if plan.fleet.links_in_kernel and "wait_timeout_s" not in config.model_fields_set:
        config = config.model_copy(update={"wait_timeout_s": KERNEL_WAIT_TIMEOUT_S})
    launch = Launch(
        out_dir, folder.write_config(config), on_progress, coordinator_listen,
        coordinator_metrics_listen, on_notice, insecure,
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
    resolved = ResultsConfig(config, network.resolved(plan.graph, fleet.runtime))
    results = write_results(
        network, fleet.records(), out_dir, config=resolved,
        wall_s=time.monotonic() - started, interrupted=interrupted,
        end_time_s=fleet.clock_s(), runtime=fleet.runtime, kernel=kernel_figures(fleet),
    )  # fmt: skip
    if interrupted:
        raise KeyboardInterrupt
    far = far_from_consensus(results)
    if far is not None:
        log.warning("%s", far)
        if on_notice is not None:
            on_notice(far)
    return results


#: A consensus run that ends with a larger relative error than this is told so.
FAR_FROM_CONSENSUS = 1e-2


def far_from_consensus(results: RunResults) -> str | None:
    """What to tell of a consensus run that ended far from the true average, else None."""
    final = results.final
    error = final.relative_error if final is not None else None
    if error is None or error <= FAR_FROM_CONSENSUS:
        return None
    return (
        f"the run ended at round {final.round} with relative error {error:.3g} to the true "
        f"average (more than {FAR_FROM_CONSENSUS:g}): far from consensus; give it more rounds "
        "(a larger or sparser fleet needs more to mix)"
    )
