"""``airgossip coordinator``: membership, neighbour assignment, metrics, service discovery."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from airgossip.cli.certs import InsecureOption, require_transport_choice
from airgossip.cli.display import console, fail
from airgossip.cli.scenario import flag_overrides


def coordinator(
    listen: Annotated[str, typer.Option(help="host:port to serve gRPC on.")] = "0.0.0.0:7070",
    metrics_port: Annotated[
        int,
        typer.Option(
            help="HTTP port on the --listen host for /metrics, /sd (Prometheus service "
            "discovery) and /fleet; 0: any free port."
        ),
    ] = 9470,
    db: Annotated[
        Path | None,
        typer.Option(help="SQLite file that keeps the fleet across restarts (default: memory)."),
    ] = None,
    token: Annotated[
        str, typer.Option(help="Join token agents must present.", envvar="AIRGOSSIP_TOKEN")
    ] = "",
    topology: Annotated[
        str | None,
        typer.Option(
            help="complete, ring, directed-ring, exponential, erdos-renyi, edges (static, from "
            "the scenario), one-peer-exponential, or k-out (random, rewired as agents come and "
            "go) (default: from config)."
        ),
    ] = None,
    out_degree: Annotated[int, typer.Option(help="Out-neighbours per agent for k-out.")] = 2,
    agents: Annotated[
        int | None, typer.Option(help="Agents to wait for (default: from config).")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="Scenario file.")] = None,
    heartbeat_interval_s: Annotated[
        float, typer.Option(help="How often agents send heartbeats.")
    ] = 2.0,
    heartbeat_timeout_s: Annotated[
        float, typer.Option(help="Silence after which an agent is declared dead.")
    ] = 10.0,
    certs: Annotated[
        Path | None,
        typer.Option(
            help="Folder with ca.pem, coordinator.pem and coordinator.key (airgossip certs): "
            "mutual TLS, each agent may act only for itself."
        ),
    ] = None,
    insecure: InsecureOption = False,
) -> None:
    """Run the coordinator: membership, neighbour assignment, metrics and service discovery."""
    import logging

    from coordinator.membership import LivenessSettings
    from coordinator.policy import POLICIES, TopologySpec
    from coordinator.service import CoordinatorServer
    from coordinator.store import StoreError
    from edge.algorithms import algorithm_class
    from edge.security import COORDINATOR_IDENTITY, SecurityError, TlsCredentials
    from edge.topology import TopologyError
    from emulation.config import ConfigError, load_config
    from emulation.networks import network_for

    require_transport_choice(certs, insecure)
    if topology is not None and topology not in POLICIES:
        fail(f"unknown topology '{topology}'; choose one of: {', '.join(POLICIES)}")
    if not 0 <= metrics_port <= 65535:
        fail(f"--metrics-port must be within 0..65535, got {metrics_port}")
    if out_degree < 1:
        fail(f"--out-degree must be at least 1, got {out_degree}")
    try:
        liveness = LivenessSettings(heartbeat_interval_s, heartbeat_timeout_s)
    except ValueError as err:
        fail(str(err))
    scenario_topology = None if topology == "k-out" else topology
    try:
        cfg = load_config(config, flag_overrides(agents=agents, topology=scenario_topology))
        if topology == "k-out":
            if not algorithm_class(cfg.algorithm).supports_directed:
                fail(f"algorithm '{cfg.algorithm}' needs an undirected graph; k-out is directed")
            spec = TopologySpec("k-out", seed=cfg.seed, out_degree=out_degree)
        else:
            network = network_for(cfg)
            network.first_graph()  # the graph can be built and fits the algorithm
            spec = network.topology()
    except ConfigError as err:
        fail(str(err))
    host = listen.rpartition(":")[0]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        security = TlsCredentials.load(certs, COORDINATOR_IDENTITY) if certs else None
        server = CoordinatorServer(
            expected=cfg.agents,
            topology=spec,
            listen=listen,
            token=token,
            security=security,
            db=db,
            liveness=liveness,
            metrics_listen=f"{host}:{metrics_port}",
        )
    except (OSError, StoreError, TopologyError, SecurityError) as err:
        fail(str(err))
    address = server.start()
    restored = "restored from " + str(db) if server.fleet.restored else "new fleet"
    console.print(
        f"coordinator on {address} ({restored}, {'mutual TLS' if certs else 'plaintext'}): "
        f"{cfg.agents} agents, {spec.name}; "
        f"heartbeats every {liveness.heartbeat_interval_s:g} s, timeout "
        f"{liveness.heartbeat_timeout_s:g} s; metrics, service discovery and fleet at "
        f"http://{server.metrics_address}/metrics, /sd, /fleet",
        highlight=False,
        soft_wrap=True,
    )
    sys.stdout.flush()  # the address matters to whoever reads a redirected log
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        while not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
