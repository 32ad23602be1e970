"""One edge agent as an OS process, over real gRPC: what every process-based fleet runs and
``airgossip agent`` runs on a device.

With a coordinator it first fetches the run (its scenario: the fleet's, one source of
truth), then serves gossip (and gRPC health) on ``--listen``, registers, trains and gossips
for the run's rounds, reports its rounds as it goes and, after the last, leaves as finished
and keeps serving until every agent has finished (so that its neighbours' last pushes still
land) or ``--linger-s`` passes. With a static peer list it reads its scenario from
``--config`` and lingers ``--linger-s``. With ``--serve-until-stopped`` it then stays up,
idle, serving its final state (gossip, ``/metrics``) until it is told to stop. Every wait
(for the coordinator, the fleet to fill, the peers) says what it waits for every few
seconds; SIGTERM/SIGINT leave cleanly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import grpc
import torch

from airgossip.common.http import MetricsServer
from airgossip.common.identity import agent_ids, natural_order
from airgossip.common.security.tls import TlsCredentials, fleet_of
from airgossip.common.stacks import StopFlag
from airgossip.coordinator.client import STATUS_POLL_S, CoordinatorClient, CoordinatorError, RunInfo
from airgossip.coordinator.run import PER_AGENT_SETTINGS
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.agent.checkpoints import (
    UNKEYED,
    CheckpointKey,
    CheckpointOwner,
    CheckpointStore,
)
from airgossip.edge.agent.lineage import new_incarnation
from airgossip.edge.agent.runner import WallClockRunner
from airgossip.edge.agent.waiting import WaitReporter
from airgossip.edge.energy import EnergyLedger
from airgossip.edge.observability.metrics import AgentMetrics
from airgossip.edge.observability.stats import FileStatsSink
from airgossip.edge.observability.telemetry import LatestStats, Telemetry
from airgossip.edge.settings import AgentSettings
from airgossip.edge.tasks import TaskError
from airgossip.edge.transport.grpc_transport import GrpcTransport
from airgossip.node.command import AgentCommand
from airgossip.node.lifecycle import (
    SHUTDOWN_GRACE_S,
    configure_process,
    die_with_parent,
    exit_after,
)
from airgossip.node.links import KernelShaping, Links, kernel_report_path
from airgossip.node.options import AgentProcessOptions, agent_options
from airgossip.node.peers import (
    fleet_config,
    static_assignment,
    static_fleet_config,
    wait_for_peers,
)
from airgossip.node.privacy import certificate_secrets, privacy_context
from airgossip.node.threads import agent_threads, host_cores
from airgossip.scenario.config import ConfigError, RunConfig
from airgossip.scenario.devices import HOST

log = logging.getLogger("airgossip.agent")


class AgentProcessError(RuntimeError):
    """An agent process that could not run: a bad flag or file, a coordinator that refused
    it, a task that would not load (one line: what was wrong)."""


def run_agent_command(
    command: AgentCommand, links: Links, stop: threading.Event | None = None
) -> int:
    """Run the agent process ``command`` describes, on the ``links`` its caller makes, to
    the end; return its exit code.

    :class:`AgentProcessError` when it cannot run. With ``--parent-pid`` the process never
    outlives that parent.
    """
    if command.parent_pid is not None:
        die_with_parent(command.parent_pid)
    try:
        config, options = agent_options(command)
        configure_process(command.threads)
        return run_agent_process(config, options, links, stop)
    except (OSError, CoordinatorError, TaskError, ValueError) as err:
        # ValueError: ConfigError and the refusals of settings that cannot work here.
        raise AgentProcessError(str(err)) from None


@dataclass
class _Held:
    """What a running agent process holds, closed in one place whatever happens."""

    client: CoordinatorClient | None = None
    agent: Agent | None = None
    exporter: MetricsServer | None = None
    kernel: KernelShaping | None = None
    #: Where the kernel's report goes when the agent ends (None: nowhere).
    kernel_report: Path | None = None
    finished: bool = False

    def close(self, *, stopped: bool) -> None:
        if self.client is not None:
            if stopped and not self.finished:
                # Told to stop: what was recorded still counts, and leaving lets the
                # coordinator repair the graph now.
                with contextlib.suppress(grpc.RpcError):
                    self.client.send_reports()
                self.client.leave("stopped")
            self.client.close()
        if self.agent is not None:
            self.agent.close()
        if self.kernel is not None:
            report = self.kernel.close()
            if self.kernel_report is not None:
                report.write(self.kernel_report)
        if self.exporter is not None:
            self.exporter.stop()


def run_identity(run: RunInfo | None, config: RunConfig, options: AgentProcessOptions) -> str:
    """The run an agent's checkpoints are bound to: the coordinator's run id; with static
    peers the one ``--run-id`` names, else ``static-`` and a digest of the scenario (without
    the settings each agent makes for itself) and the peer list, so that another scenario or
    fleet is another run (and the same scenario run again is the same run: give
    ``--run-id`` to tell them apart)."""
    if run is not None:
        return run.run_id
    if options.run_id is not None:
        return options.run_id
    scenario = config.model_dump(mode="json", exclude=set(PER_AGENT_SETTINGS))
    text = json.dumps([scenario, sorted((options.peers or {}).items())], sort_keys=True)
    return f"static-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def run_agent_process(
    config: RunConfig | None,
    options: AgentProcessOptions,
    links: Links,
    stop: threading.Event | None = None,
) -> int:
    """Run one agent on the ``links`` its caller makes to the end; return the process exit
    code.

    ``config``: the agent's own settings; with a coordinator that hands out a scenario the
    agent runs the fleet's instead (and is refused when its own disagree).
    """
    stop = stop or threading.Event()
    held = _Held()

    def stop_all(why: str) -> None:
        exit_after(SHUTDOWN_GRACE_S, f"told to stop ({why})")
        stop.set()
        if held.agent is not None:
            held.agent.stop()
        if held.client is not None:
            held.client.cancel()  # a registration or a wait still retrying gives up

    if threading.current_thread() is threading.main_thread():
        # The handler only sets a flag (StopFlag: Event.set in a handler can deadlock on the
        # lock of an Event.wait it interrupted); a thread does the stopping.
        asked = StopFlag()
        signals: list[str] = []

        def on_signal(signum: int, frame: FrameType | None) -> None:
            signals.append(signal.Signals(signum).name)
            asked.set()

        def relay() -> None:
            asked.wait(math.inf)
            stop_all(signals[0])

        threading.Thread(target=relay, name="stop-relay", daemon=True).start()
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    try:
        return _run_agent(config, options, links, stop, held)
    finally:
        held.close(stopped=stop.is_set())


def _run_agent(
    config: RunConfig | None,
    options: AgentProcessOptions,
    source: Links,
    stop: threading.Event,
    held: _Held,
) -> int:
    # Local settings that cannot work fail before any waiting (a busy metrics port, say).
    metrics = AgentMetrics(options.agent_id) if options.metrics_listen is not None else None
    if metrics is not None and options.metrics_listen is not None:
        held.exporter = MetricsServer(
            metrics.registry, options.metrics_listen, security=options.metrics_security
        )
    run: RunInfo | None = None
    security = TlsCredentials.load(options.certs, options.agent_id) if options.certs else None
    if options.coordinator:
        held.client = CoordinatorClient(
            options.coordinator, options.agent_id, token=options.token, security=security
        )
        try:
            run = held.client.fetch_run(options.declared, timeout_s=options.ready_timeout_s)
        except CoordinatorError:
            if stop.is_set():
                log.info("%s stopped while waiting for the coordinator", options.agent_id)
                return 0
            raise
        config = fleet_config(run, config, options.declared, options.coordinator)
        log.info(
            "%s joins run %s: %d agents, %d rounds, task %s, %s, %s links",
            options.agent_id, run.run_id, config.agents, config.rounds, config.task.name,
            config.algorithm, "emulated" if config.emulates_links else "real",
        )  # fmt: skip
    elif options.peers:
        if config is None:
            raise ConfigError("an agent with static peers needs --config (its scenario)")
        config = static_fleet_config(config, options.peers, options.declared)
    if config is None:
        raise ConfigError("give --config, or --coordinator for the fleet's scenario")
    if not 0 <= options.index < config.agents:
        raise ConfigError(
            f"--index {options.index} is outside the fleet of {config.agents} agents "
            f"(0..{config.agents - 1})"
        )
    settings: AgentSettings = config.agent_settings()
    network = source.network_for(config)
    ids = natural_order(options.peers) if options.peers else tuple(agent_ids(config.agents))
    links = network.runtime(list(ids))
    refusal = links.refuse_agent(options.agent_id)
    if refusal is not None:
        raise ConfigError(refusal)
    latest = LatestStats()
    telemetry = Telemetry(
        FileStatsSink(options.stats_dir, options.agent_id) if options.stats_dir else None,
        metrics,
        latest,
        held.client,  # round reports for the run's results
    )
    if options.kernel_device is not None and config.emulates_links:
        if source.kernel_links is None:
            raise ConfigError(
                "--kernel-links: this agent process cannot shape links in the kernel "
                "(start it as `airgossip agent` or `python -m airgossip.emulation.agent`)"
            )
        held.kernel = source.kernel_links(network, list(ids), options, metrics)
        held.kernel_report = kernel_report_path(options)
    shaper = links.shaper if options.shape_links and held.kernel is None else None
    # The network may add its figures (a wireless link count, say) to every round record.
    stats = links.sink(telemetry)
    transport = GrpcTransport(
        options.agent_id, listen=options.listen, shaper=shaper, security=security,
        bulk_bytes=config.transport.bulk_bytes,
    )  # fmt: skip
    checkpoints = None
    if options.checkpoint_dir is not None:
        # Bound to this fleet, run and agent, MACed under a key derived from the agent's own
        # TLS key (see airgossip.edge.agent.checkpoints).
        owner = CheckpointOwner(
            options.agent_id, fleet_of(security), run_identity(run, config, options)
        )
        key = CheckpointKey.of_private_key(security.key_pem) if security else UNKEYED
        checkpoints = CheckpointStore(
            options.checkpoint_dir, options.agent_id, owner=owner, key=key
        )
    client = held.client
    agent = held.agent = build_agent(
        options.agent_id,
        index=options.index,
        num_agents=config.agents,
        settings=settings,
        transport=transport,
        stats=stats,
        observer=telemetry,
        fleet=fleet_of(security),
        checkpoints=checkpoints,
        checkpoint_interval_s=options.checkpoint_interval_s,
        # A process that may restart: see airgossip.edge.agent.lineage.
        incarnation=new_incarnation(),
        privacy=privacy_context(
            config, network, ids, certificate_secrets(config, security, options.certs)
        ),
    )
    power = config.device_class(options.index).power_model()
    if power is not None:  # its device class draws power: what it spends is accounted
        agent.energy = EnergyLedger(options.agent_id, power, links.rate_bps)
    if options.threads is None:  # not told: what the model's size and the host allow
        parameters = agent.algorithm.estimate().numel()
        threads = agent_threads(parameters, options.host_agents, host_cores())
        torch.set_num_threads(threads)
        host = f"{options.host_agents} agents" if options.host_agents else "agents unknown"
        log.info(
            "%s computes on %d torch thread(s): %d parameters, %d cores, %s on this host "
            "(--threads, --host-agents say otherwise)",
            options.agent_id, threads, parameters, host_cores(), host,
        )  # fmt: skip
    agent.resume()  # from the newest intact checkpoint, if it keeps any
    if stop.is_set():
        return 0
    if client is None:
        # Static peers: the neighbours are known before the agent serves, so no push can
        # reach it before it knows who may send one.
        agent.set_assignment(static_assignment(network, options.agent_id, options.peers or {}))
    address = agent.start()
    advertise = options.advertise or address
    # The process's CPU so far is its start-up: a fresh interpreter's imports included, or
    # only what it did since a fork server forked it (a child's CPU clock starts at zero).
    log.info(
        "%s serving on %s (advertised as %s); start-up took %.2f s of CPU",
        options.agent_id, address, advertise, time.process_time(),
    )  # fmt: skip
    metrics_address = ""
    exporter = held.exporter
    if exporter is not None:
        exporter.start()
        host = (
            advertise.rpartition(":")[0]
            if options.advertise
            else exporter.address.rpartition(":")[0]
        )
        metrics_address = options.metrics_advertise or f"{host}:{exporter.port}"
        scheme = exporter.security.scheme
        log.info("%s metrics on %s://%s/metrics", options.agent_id, scheme, metrics_address)
    if client is not None:
        try:
            client.register(
                advertise,
                agent.digest,
                metrics_address=metrics_address,
                model_numel=agent.algorithm.estimate().numel(),
                timeout_s=options.ready_timeout_s,
            )
        except CoordinatorError:
            if stop.is_set():
                return 0
            raise
        client.follow(agent.set_assignment)
        client.start_heartbeats(latest.snapshot)
        if not client.wait_ready(lambda: agent.assignment is not None, options.ready_timeout_s):
            if stop.is_set():
                return 0
            log.error("no neighbour assignment within %.0f s", options.ready_timeout_s)
            return 3
    else:
        assert agent.assignment is not None
        wait_for_peers(options.agent_id, agent.assignment, options.ready_timeout_s, stop, security)
    if stop.is_set():
        return 0
    assert agent.assignment is not None
    if held.kernel is not None:
        held.kernel.follow(lambda: agent.assignment.peers if agent.assignment else {})
    # A network whose graph changes with time installs it from now on; the radio figures
    # of the agent's out-links go to its metrics (until training ends, for an agent that
    # stays serving afterwards).
    following = threading.Event() if options.serve_until_stopped else stop
    links.follow(agent, following, metrics.observe_links if metrics is not None else None)
    log.info(
        "%s starts: %d rounds, out-neighbours %s",
        options.agent_id,
        settings.rounds,
        ", ".join(agent.assignment.phase(1).out_weights) or "none",
    )
    online = config.online_schedule(options.index) if source.emulates_devices else None
    runner = WallClockRunner(
        agent, _stretch(config, options, source), online, config.wait_timeout_of(options.index)
    )
    if run is not None:
        runner.rejoin(run.fleet_round)  # a run under way: start where the fleet is
    try:
        runner.run()
        if stop.is_set():
            return 0
        held.finished = True
        log.info("%s finished %d rounds", options.agent_id, agent.round)
        _linger(agent.agent_id, client, run, options, stop)
        if options.serve_until_stopped:
            _serve_until_stopped(agent.agent_id, held, following, stop)
        return 0
    finally:
        if following is not stop:
            following.set()


def _stretch(config: RunConfig, options: AgentProcessOptions, source: Links) -> float:
    """How many times its host's time each local step of this agent takes: its device
    class's, in an emulated fleet (said in the log); 1 on a real device."""
    device = config.device_class(options.index)
    if device is HOST or device.speed == 1.0:
        return 1.0
    if not source.emulates_devices:
        log.info(
            "%s is of device class '%s' on a real device: its speed is not emulated",
            options.agent_id, device.name,
        )  # fmt: skip
        return 1.0
    if device.speed > 1.0:
        log.warning(
            "%s is of device class '%s' (speed %g): an agent process cannot compute faster "
            "than its host, so it runs at the host's speed (a virtual clock can)",
            options.agent_id, device.name, device.speed,
        )  # fmt: skip
        return 1.0
    log.info(
        "%s is of device class '%s': each local step stretched to %g times the host's",
        options.agent_id, device.name, device.stretch,
    )  # fmt: skip
    return device.stretch


def _serve_until_stopped(
    agent_id: str, held: _Held, following: threading.Event, stop: threading.Event
) -> None:
    """After the run: keep serving gossip and ``/metrics`` with the final state until
    ``stop``, idle (no graph followed, the kernel's shaping taken off and its last counts in
    the metrics)."""
    following.set()
    if held.kernel is not None:
        report = held.kernel.close()
        if held.kernel_report is not None:
            report.write(held.kernel_report)
        held.kernel = None
    log.info("%s serving its final state until stopped (SIGTERM)", agent_id)
    while not stop.wait(3600.0):
        pass


def _linger(
    agent_id: str,
    client: CoordinatorClient | None,
    run: RunInfo | None,
    options: AgentProcessOptions,
    stop: threading.Event,
) -> None:
    """After the last round: report it and leave as finished, then keep serving (the
    neighbours' last messages may still be on their way) until the run is complete or
    ``linger_s`` passes."""
    if client is None or run is None:
        log.info("%s serving its neighbours for %.0f s more", agent_id, options.linger_s)
        stop.wait(options.linger_s)
        return
    delivered = client.finish(options.report_timeout_s)
    log.info(
        "%s %s run %s as finished; serving its neighbours until every agent has finished "
        "(at most %.0f s)",
        agent_id, "reported its rounds and left" if delivered else "left", run.run_id,
        options.linger_s,
    )  # fmt: skip
    deadline = time.monotonic() + options.linger_s
    waiting = WaitReporter(agent_id, f"the rest of run {run.run_id} to finish")
    while not stop.wait(min(STATUS_POLL_S, max(0.0, deadline - time.monotonic()))):
        status = client.run_status()
        if status is None or status.complete:
            log.info(
                "%s: run %s %s; leaving", agent_id, run.run_id,
                "is complete" if status else "coordinator gone",
            )  # fmt: skip
            return
        if time.monotonic() >= deadline:
            return
        waiting.tick(f"{status.finished} of {status.registered} agents finished")
