"""``airgossip coordinator``: a run of agents started by hand, with membership, neighbour
assignment, metrics and service discovery, to results.json, a plot and a summary."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from airgossip.cli.certs import InsecureOption, require_transport_choice
from airgossip.cli.display import console, fail, say, summary_table, write_summary
from airgossip.cli.metrics_access import (
    MetricsPasswordFileOption,
    MetricsTlsOption,
    MetricsUserOption,
    metrics_security,
)
from airgossip.cli.scenario import flag_overrides

if TYPE_CHECKING:  # the CLI imports the coordinator and the fleets only when it runs
    from coordinator.membership import FleetView
    from coordinator.service import CoordinatorServer
    from edge.topology import Graph
    from emulation.config import RunConfig
    from emulation.networks import LinkRuntime, Network
    from emulation.results import RunResults

#: Seconds between two progress lines of the run on the coordinator's console.
PROGRESS_EVERY_S = 10.0


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
            help="complete, ring, directed-ring, exponential, one-peer-exponential, "
            "erdos-renyi, edges (static, from the scenario), or k-out (random, rewired as "
            "agents come and go) (default: from config, else exponential)."
        ),
    ] = None,
    out_degree: Annotated[int, typer.Option(help="Out-neighbours per agent for k-out.")] = 2,
    agents: Annotated[
        int | None, typer.Option(help="Agents to wait for (default: from config, else 8).")
    ] = None,
    rounds: Annotated[
        int | None, typer.Option(help="Rounds per agent (default: from config, else 40).")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help=escape(
                "Scenario file every agent runs (handed out at registration; links are real "
                "unless its [network] or [wireless] table asks for emulation)."
            ),
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Where the run's results.json, results.png and summary.txt go when every "
            "agent has finished (default: runs/<run id>)."
        ),
    ] = None,
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
    metrics_tls: MetricsTlsOption = False,
    metrics_user: MetricsUserOption = None,
    metrics_password_file: MetricsPasswordFileOption = None,
) -> None:
    """Run the coordinator of a run: agents started by hand register, get the scenario and
    their neighbours, report their rounds; results.json, the plot and the summary are written
    when every agent has finished (then the coordinator exits)."""
    stopped = threading.Event()  # SIGTERM from here on: stop as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    import logging

    from coordinator.malloc import cap_arenas
    from coordinator.membership import LivenessSettings
    from coordinator.policy import POLICIES, TopologySpec
    from coordinator.run import RunSpec
    from coordinator.service import CoordinatorServer
    from coordinator.store import StoreError
    from edge.algorithms import algorithm_class
    from edge.config.identity import agent_ids
    from edge.security.tls import COORDINATOR_IDENTITY, SecurityError, TlsCredentials
    from edge.topology import TopologyError
    from emulation.config import ConfigError, load_config
    from emulation.fleets import refuse_used_out_dir
    from emulation.networks import network_for

    cap_arenas()  # a burst of large requests leaves no memory behind in many arenas
    require_transport_choice(certs, insecure)
    guard = metrics_security(
        certs, COORDINATOR_IDENTITY, metrics_tls, metrics_user, metrics_password_file
    )
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
        overrides = flag_overrides(agents=agents, topology=scenario_topology, rounds=rounds)
        cfg = load_config(config, overrides, real_links=True)
        # A wireless scenario's t = 0 is now, on every agent's wall clock (or, for a run
        # taken back from --db, when that run started).
        cfg = network_for(_with_stored_epoch(cfg, db)).launch_config(time.time())
        network = network_for(cfg)
        if topology == "k-out":
            if cfg.switching is not None:
                fail(
                    "k-out is the coordinator's own graph; a [switching] schedule names the "
                    "graphs it goes through: leave --topology out"
                )
            if not algorithm_class(cfg.algorithm).supports_directed:
                fail(f"algorithm '{cfg.algorithm}' needs an undirected graph; k-out is directed")
            spec = TopologySpec("k-out", seed=cfg.seed, out_degree=out_degree)
        else:
            spec = network.topology()
        graph = network.first_graph()  # the graph can be built and fits the algorithm
        # A [switching] schedule: the coordinator plays the runtime's after_round, from the
        # agents' round reports.
        runtime = network.runtime(list(agent_ids(cfg.agents))) if network.round_driven else None
    except (ConfigError, StoreError) as err:
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
            metrics_security=guard,
            run=RunSpec(scenario=cfg.model_dump(mode="json"), rounds=cfg.rounds),
            switcher=runtime.switcher if runtime is not None else None,
        )
    except (OSError, StoreError, TopologyError, SecurityError) as err:
        fail(str(err))
    run_id = server.run_id
    out_dir = out or Path("runs") / run_id
    try:
        refuse_used_out_dir(out_dir)
    except ConfigError as err:
        server.stop(grace_s=0)
        fail(str(err))
    address = server.start()
    restored = "restored from " + str(db) if server.restored else "new fleet"
    links = _links(cfg, network, spec.name)
    say(
        f"coordinator on {address} ({restored}), {'mutual TLS' if certs else 'plaintext'}, "
        f"run {run_id}: {cfg.agents} agents · "
        f"{links} · {cfg.algorithm} · task {cfg.task.name} · {cfg.rounds} rounds; "
        f"heartbeats every {liveness.heartbeat_interval_s:g} s, timeout "
        f"{liveness.heartbeat_timeout_s:g} s"
    )
    say(
        f"metrics at {guard.scheme}://{server.metrics_address}/metrics (service discovery /sd, "
        f"fleet /fleet{'; basic auth' if guard.basic_auth else ''}); results to {out_dir}"
    )
    say(
        f"agents need only: airgossip agent --coordinator {_dial(address)} --index N"
        + (" --token TOKEN" if token else "")
        + (" --certs DIR" if certs else " --insecure")
    )
    sys.stdout.flush()  # the address matters to whoever reads a redirected log
    started = time.monotonic()
    interrupted = False
    try:
        next_line = time.monotonic() + PROGRESS_EVERY_S
        while not server.status().complete:
            if stopped.wait(0.5):
                interrupted = True
                break
            if time.monotonic() >= next_line:
                next_line = time.monotonic() + PROGRESS_EVERY_S
                say(progress_line(server.view(), cfg.rounds))
                sys.stdout.flush()
    except KeyboardInterrupt:
        interrupted = True
    try:
        results = collect_results(
            server, cfg, network, graph, spec.name, out_dir,
            wall_s=time.monotonic() - started, interrupted=interrupted, runtime=runtime,
        )  # fmt: skip
    finally:
        server.stop()
    if results is None:
        say(f"run {run_id} stopped before any agent reported a round; nothing written")
        raise typer.Exit(130 if interrupted else 0)
    console.print(summary_table(results, out_dir, links, title=f"run {run_id}"))
    write_summary(out_dir / "summary.txt", results, out_dir, links, title=f"run {run_id}")
    if interrupted:
        say(f"interrupted: partial results in {out_dir}")
        raise typer.Exit(130)


def _with_stored_epoch(cfg: RunConfig, db: Path | None) -> RunConfig:
    """``cfg`` with the wireless t = 0 of the run ``db`` holds, if it holds one."""
    from coordinator.store import FleetStore

    if db is None or cfg.wireless is None or not db.exists():
        return cfg
    store = FleetStore(db)
    try:
        stored = store.stored_run()
    finally:
        store.close()
    table = stored[1].get("wireless") if stored else None
    epoch = table.get("epoch_unix") if isinstance(table, dict) else None
    if not isinstance(epoch, int | float):
        return cfg
    wireless = cfg.wireless.model_copy(update={"epoch_unix": epoch})
    return cfg.model_copy(update={"wireless": wireless})


def _dial(address: str) -> str:
    """The address agents dial: a wildcard host is this machine's name."""
    import socket

    host, _, port = address.rpartition(":")
    return f"{socket.gethostname()}:{port}" if host in ("0.0.0.0", "[::]", "::") else address


def _links(cfg: RunConfig, network: Network, topology: str) -> str:
    """What the links are: real unless the scenario emulates something."""
    if cfg.wireless is not None:
        return network.describe()
    if cfg.switching is not None and topology == cfg.topology:
        topology = " → ".join(cfg.switching.topologies)
    if not cfg.emulates_links:
        return f"{topology} · real links"
    n = cfg.network
    emulated = [
        (n.loss, f"loss {n.loss:g}"),
        (n.latency_ms, f"latency {n.latency_ms:g} ms"),
        (n.jitter_ms, f"jitter {n.jitter_ms:g} ms"),
        (n.bandwidth_mbps, f"rate {n.bandwidth_mbps:g} Mb/s"),
    ]
    return f"{topology} · emulated " + ", ".join(text for value, text in emulated if value)


def progress_line(view: FleetView, rounds: int) -> str:
    """One line on how far the run is: rounds, agents, accuracy, messages lost."""
    members = [m for m in view.members if m.state in ("alive", "finished")]
    if not view.released:
        return f"waiting for the fleet to fill: {len(members)} of {view.expected} agents"
    stats = [m.stats for m in members if m.stats is not None]
    reached = [s.round for s in stats]
    accuracies = [s.accuracy for s in stats if s.accuracy is not None]
    sent = sum(s.counters.messages_sent for s in stats)
    lost = sum(s.counters.messages_lost for s in stats)
    finished = sum(1 for m in members if m.state == "finished")
    text = (
        f"round {min(reached, default=0)}/{rounds} (slowest agent) · {len(members)} agents, "
        f"{finished} finished"
    )
    if accuracies:
        text += f" · acc {sum(accuracies) / len(accuracies):.3f}"
    return f"{text} · {lost}/{sent} msgs lost"


def collect_results(
    server: CoordinatorServer,
    cfg: RunConfig,
    network: Network,
    graph: Graph,
    topology: str,
    out_dir: Path,
    *,
    wall_s: float,
    interrupted: bool,
    runtime: LinkRuntime | None = None,
) -> RunResults | None:
    """The run's results from the round records the agents reported (None: none did);
    ``runtime``: the links the coordinator followed (its ``[switching]`` schedule, say)."""
    from emulation.fleets.run import write_results
    from emulation.results import RunIdentity

    records = server.round_records()
    if not records:
        return None
    view = server.view()
    resolved = network.resolved(graph)
    resolved["mode"] = "devices"  # agents started by hand, wherever they ran
    if topology != cfg.topology and cfg.wireless is None:
        # The coordinator's own topology (k-out): its graph's figures, not the scenario's.
        phases = [len(phase) for phase in view.edges] or [0]
        resolved.update(topology=topology, lambda2=view.lambda2, topology_period=len(phases),
                        edges_per_round=sum(phases) / len(phases))  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    status, ended = view.run, time.time()
    if status is not None and status.started_unix is not None:
        wall_s = ended - status.started_unix  # the run's own time, from the full fleet on
    results = write_results(
        cfg, network, records, out_dir, resolved=resolved, wall_s=wall_s,
        interrupted=interrupted, end_time_s=network.wall_clock()(), runtime=runtime,
        links=_links(cfg, network, topology),
    )  # fmt: skip
    last = [agent_records[-1].counters for agent_records in records.values() if agent_records]
    results.run = RunIdentity(
        id=server.run_id,
        started_unix=status.started_unix if status is not None else None,
        ended_unix=round(ended, 3),
        agents={m.agent_id: m.state for m in view.members},
        messages_emulated_drops=sum(c.messages_dropped for c in last),
        messages_failed=sum(c.messages_failed for c in last),
    )
    results.write(out_dir / "results.json")
    return results
