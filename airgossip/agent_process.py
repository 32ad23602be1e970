"""``airgossip agent``: one edge agent as an OS process, over real gRPC.

It serves gossip (and gRPC health) on ``--listen``, registers with a coordinator or reads a
static peer list, trains and gossips for the configured rounds, then keeps serving until it
is told to stop (SIGTERM/SIGINT) or ``--linger-s`` passes, so that its neighbours' last
pushes still land.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.client import CoordinatorClient, CoordinatorError
from edge.agent import Agent, build_agent
from edge.identity import agent_ids, natural_order
from edge.metrics import AgentMetrics, MetricsServer
from edge.settings import AgentSettings
from edge.stats import FileStatsSink
from edge.telemetry import LatestStats, Telemetry
from edge.topology import Assignment, TopologyError, assignments_for_graph
from edge.transport.grpc_transport import GrpcTransport
from emulation.config import ConfigError, RunConfig
from emulation.networks import Network, network_for
from emulation.networks.kernel import AgentKernelLinks, KernelUnavailable

log = logging.getLogger("airgossip.agent")


#: Longest graceful shutdown (leave, drain sends, close servers) before the process exits anyway.
SHUTDOWN_GRACE_S = 8.0


def exit_after(seconds: float, why: str) -> None:
    """Exit the process in ``seconds`` whatever the main thread is doing (a daemon timer):
    a shutdown stuck on a dying peer or coordinator must not leave the agent behind."""

    def hard_exit() -> None:
        log.warning("%s: still running %.0f s later; exiting now", why, seconds)
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(seconds, hard_exit)
    timer.daemon = True
    timer.start()


def die_with_parent(parent_pid: int) -> None:
    """Make sure this process never outlives its parent (the launcher): the kernel sends
    SIGTERM when the parent dies (Linux), and a watchdog thread exits the process if the
    parent is gone while the main thread cannot run the signal handler. Exit at once if
    the parent is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:
        raise SystemExit("parent process is gone; not starting")

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        exit_after(SHUTDOWN_GRACE_S, "parent process gone")

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


@dataclass(frozen=True)
class AgentProcessOptions:
    agent_id: str
    index: int
    listen: str = "127.0.0.1:0"
    advertise: str | None = None
    coordinator: str | None = None
    peers: dict[str, str] | None = None
    token: str = ""
    stats_dir: Path | None = None
    linger_s: float = 10.0
    ready_timeout_s: float = 120.0
    #: host:port of the Prometheus endpoint (None: no metrics); port 0 picks a free port.
    metrics_listen: str | None = None
    #: host:port scrapers should use [default: the advertised host, the bound port].
    metrics_advertise: str | None = None
    #: Shape the links in the agent (off where a kernel shapes them).
    shape_links: bool = True
    #: Shape this agent's links in the kernel on this interface of its own network
    #: namespace (a container with NET_ADMIN); in the agent where that is refused.
    kernel_device: str | None = None


def static_assignment(network: Network, agent_id: str, peers: dict[str, str]) -> Assignment:
    """This agent's neighbours from a static peer list (no coordinator): the network's
    topology over the listed ids in natural order."""
    if agent_id not in peers:
        raise ConfigError(f"agent id '{agent_id}' is not in the peer list ({', '.join(peers)})")
    ids = natural_order(peers)
    try:
        graph = network.topology().graph(len(ids))
    except TopologyError as err:
        raise ConfigError(str(err)) from None
    return assignments_for_graph(graph, {i: peers[i] for i in ids}, scheme=network.scheme)[agent_id]


def _wait_for_peers(assignment: Assignment, timeout_s: float, stop: threading.Event) -> None:
    """Wait until every peer answers the gRPC health check (bounded by ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    pending = dict(assignment.peers)
    while pending and time.monotonic() < deadline and not stop.is_set():
        for peer, address in list(pending.items()):
            with grpc.insecure_channel(address) as channel:
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=""), timeout=1.0
                    )
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        pending.pop(peer)
                except grpc.RpcError:
                    pass
        if pending:
            stop.wait(0.2)
    if pending:
        log.warning("starting without hearing from: %s", ", ".join(pending))


def kernel_links(
    network: Network, ids: list[str], options: AgentProcessOptions, metrics: AgentMetrics | None
) -> AgentKernelLinks | None:
    """This agent's links shaped by the kernel on ``options.kernel_device``, or None (and a
    line in the log, and the reason in ``<id>.kernel.json``) where the kernel refuses."""
    assert options.kernel_device is not None
    if options.agent_id not in ids:
        raise ConfigError(
            f"--kernel-links needs one of the fleet's agent ids ({ids[0]} to {ids[-1]}), "
            f"not '{options.agent_id}'"
        )
    links = AgentKernelLinks(
        network.kernel_links(), ids.index(options.agent_id), ids, network.wall_clock(),
        device=options.kernel_device,
        on_packets=metrics.observe_link_packets if metrics is not None else None,
    )  # fmt: skip
    try:
        links.start()
    except KernelUnavailable as err:
        log.warning(
            "%s cannot shape its links in the kernel: %s; shaping them in the agent instead",
            options.agent_id,
            err,
        )
        report = {"agent": options.agent_id, "kernel": False, "reason": str(err)}
        write_kernel_report(options, report)
        return None
    log.info("%s shapes its links in the kernel on %s", options.agent_id, options.kernel_device)
    return links


def write_kernel_report(options: AgentProcessOptions, report: dict[str, object]) -> None:
    """``<id>.kernel.json`` beside the agent's records (the container fleet gathers them)."""
    if options.stats_dir is not None:
        path = options.stats_dir / f"{options.agent_id}.kernel.json"
        path.write_text(json.dumps(report, indent=2) + "\n")


def run_agent_process(
    config: RunConfig, options: AgentProcessOptions, stop: threading.Event | None = None
) -> int:
    """Run one agent to the end; return the process exit code."""
    stop = stop or threading.Event()
    settings: AgentSettings = config.agent_settings()
    network = network_for(config)
    ids = natural_order(options.peers) if options.peers else tuple(agent_ids(config.agents))
    links = network.runtime(list(ids))
    refusal = links.refuse_agent(options.agent_id)
    if refusal is not None:
        raise ConfigError(refusal)
    latest = LatestStats()
    metrics = AgentMetrics(options.agent_id) if options.metrics_listen is not None else None
    telemetry = Telemetry(
        FileStatsSink(options.stats_dir, options.agent_id) if options.stats_dir else None,
        metrics,
        latest,
    )
    kernel = kernel_links(network, list(ids), options, metrics) if options.kernel_device else None
    shaper = links.shaper if options.shape_links and kernel is None else None
    # The network may add its figures (a wireless link count, say) to every round record.
    stats = links.sink(telemetry)
    transport = GrpcTransport(options.agent_id, listen=options.listen, shaper=shaper)
    agent: Agent = build_agent(
        options.agent_id,
        index=options.index,
        num_agents=config.agents,
        settings=settings,
        transport=transport,
        stats=stats,
        observer=telemetry,
    )

    client: CoordinatorClient | None = None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not stop.is_set():
            exit_after(SHUTDOWN_GRACE_S, f"told to stop ({signal.Signals(signum).name})")
        stop.set()
        agent.stop()
        if client is not None:
            client.cancel()  # a registration still retrying gives up

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    exporter: MetricsServer | None = None
    if metrics is not None and options.metrics_listen is not None:
        exporter = MetricsServer(metrics.registry, options.metrics_listen)
    address = agent.start()
    advertise = options.advertise or address
    log.info("%s serving on %s (advertised as %s)", options.agent_id, address, advertise)
    metrics_address = ""
    if exporter is not None:
        exporter.start()
        host = (
            advertise.rpartition(":")[0]
            if options.advertise
            else exporter.address.rpartition(":")[0]
        )
        metrics_address = options.metrics_advertise or f"{host}:{exporter.port}"
        log.info("%s metrics on http://%s/metrics", options.agent_id, metrics_address)
    try:
        if options.coordinator:
            client = CoordinatorClient(options.coordinator, options.agent_id, token=options.token)
            try:
                client.register(
                    advertise,
                    agent.digest,
                    metrics_address=metrics_address,
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
            assignment = static_assignment(network, options.agent_id, options.peers or {})
            agent.set_assignment(assignment)
            _wait_for_peers(assignment, options.ready_timeout_s, stop)
        assert agent.assignment is not None
        if kernel is not None:
            kernel.follow(lambda: agent.assignment.peers if agent.assignment else {})
        # A network whose graph changes with time installs it from now on; the radio figures
        # of the agent's out-links go to its metrics.
        links.follow(agent, stop, metrics.observe_links if metrics is not None else None)
        log.info(
            "%s starts: %d rounds, out-neighbours %s",
            options.agent_id,
            settings.rounds,
            ", ".join(agent.assignment.phase(1).out_weights) or "none",
        )
        agent.run()
        if not stop.is_set():
            log.info("%s finished %d rounds; serving until stopped", options.agent_id, agent.round)
            stop.wait(options.linger_s)
        return 0
    finally:
        if client is not None:
            if stop.is_set():
                client.leave()  # told to stop: leave so the coordinator repairs the graph now
            client.close()
        agent.close()
        if kernel is not None:
            write_kernel_report(options, {"kernel": True, **kernel.close()})
        if exporter is not None:
            exporter.stop()


def configure_process(threads: int | None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if threads:
        torch.set_num_threads(threads)
