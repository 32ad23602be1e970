"""``airgossip coordinator``: a run of agents started by hand, with membership, neighbour
assignment, metrics and service discovery, to results.json, a plot and a summary."""

from __future__ import annotations

import logging
import signal
import sys
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

if TYPE_CHECKING:  # the CLI imports the coordinator and the runtime only when it runs
    from airgossip.common.stacks import StopFlag
    from airgossip.coordinator.membership import FleetView
    from airgossip.node.devices import DeviceRun

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
            help="{topologies} (static, from the scenario), or k-out (random, rewired as "
            "agents come and go) (default: from config, else exponential)."
        ),
    ] = None,
    out_degree: Annotated[int, typer.Option(help="Out-neighbours per agent for k-out.")] = 2,
    agents: Annotated[
        int | None, typer.Option(help="Agents to wait for (default: from config, else 8).")
    ] = None,
    roster: Annotated[
        str | None,
        typer.Option(
            help="The identities that may take part (with --certs, the certificate's): a "
            "comma-separated list of ids (pi-kitchen), index ranges (0..15: agent-0..agent-15) "
            "and id ranges (node-4..node-7); @FILE reads them from a file, one or more a line; "
            "'any' admits every identity the CA (or the token) lets in. Any other caller is "
            "refused (PERMISSION_DENIED) and changes nothing. It names at least --agents ids; "
            "more are spares (k-out takes newcomers among them). Default: agent-0 .. "
            "agent-(N-1) for N agents, the ids of agents started with --index."
        ),
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
    serve_until_stopped: Annotated[
        bool,
        typer.Option(
            "--serve-until-stopped",
            help="Once every agent has finished and the results are written, keep serving "
            "/metrics, /sd and /fleet (the final state), idle, until SIGTERM or Ctrl-C.",
        ),
    ] = False,
    insecure: InsecureOption = False,
    metrics_tls: MetricsTlsOption = False,
    metrics_user: MetricsUserOption = None,
    metrics_password_file: MetricsPasswordFileOption = None,
) -> None:
    """Run the coordinator of a run: agents started by hand register, get the scenario and
    their neighbours, report their rounds; results.json, the plot and the summary are written
    when every agent has finished (then the coordinator exits, or with --serve-until-stopped
    serves the final state until it is stopped)."""
    from airgossip.common.stacks import StopFlag  # no lock a handler could find held

    stopped = StopFlag()  # SIGTERM from here on: stop as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    # A mask inherited from whoever started us (exec keeps it) must not hold the stop back.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    # What the flags alone say is wrong, before torch and gRPC are imported.
    from airgossip.cli.early import check_flags, check_policy, check_port

    require_transport_choice(certs, insecure)
    check_policy(topology)
    check_port("--metrics-port", metrics_port)
    check_flags(
        {k: v for k, v in (("agents", agents), ("rounds", rounds)) if v is not None}, config
    )

    from airgossip.common.security.tls import COORDINATOR_IDENTITY
    from airgossip.common.stacks import exit_deadline
    from airgossip.coordinator.malloc import cap_arenas, return_freed_memory
    from airgossip.emulation.networks import network_for
    from airgossip.node.devices import DeviceRun, DeviceRunError, DeviceRunSettings

    cap_arenas()  # a burst of large requests leaves no memory behind in many arenas
    return_freed_memory()  # the memory of closed connections handed back to the kernel
    guard = metrics_security(
        certs, COORDINATOR_IDENTITY, metrics_tls, metrics_user, metrics_password_file
    )
    settings = DeviceRunSettings(
        listen=listen, metrics_port=metrics_port, db=db, token=token, topology=topology,
        out_degree=out_degree, agents=agents, rounds=rounds, config=config, out=out,
        heartbeat_interval_s=heartbeat_interval_s, heartbeat_timeout_s=heartbeat_timeout_s,
        certs=certs, metrics_security=guard, roster=roster,
    )  # fmt: skip
    try:
        run = DeviceRun(settings, network_for)
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        address = run.start()
    except DeviceRunError as err:
        fail(str(err))
    server, cfg, links = run.server, run.config, run.links
    assert server is not None
    run_id = server.run_id
    restored = "restored from " + str(db) if server.restored else "new fleet"
    say(
        f"coordinator on {address} ({restored}), {'mutual TLS' if certs else 'plaintext'}, "
        f"run {run_id}: {cfg.agents} agents · "
        f"{links} · {cfg.algorithm} · task {cfg.task.name} · {cfg.rounds} rounds; "
        f"heartbeats every {run.liveness.heartbeat_interval_s:g} s, timeout "
        f"{run.liveness.heartbeat_timeout_s:g} s"
    )
    say(
        f"roster: {run.roster.describe()}"
        + (" (any identity may register: --roster any)" if run.roster.open else "")
    )
    say(
        f"metrics at {guard.scheme}://{server.metrics_address}/metrics (service discovery /sd, "
        f"fleet /fleet{'; basic auth' if guard.basic_auth else ''}); results to {run.out_dir}"
    )
    say(
        f"agents need only: airgossip agent --coordinator {_dial(address)} --index N"
        + (" --token TOKEN" if token else "")
        + (" --certs DIR" if certs else " --insecure")
    )
    sys.stdout.flush()  # the address matters to whoever reads a redirected log

    def show(view: FleetView) -> None:
        say(progress_line(view, cfg.rounds))
        sys.stdout.flush()

    interrupted = not run.follow(stopped, show, PROGRESS_EVERY_S)
    try:
        _finish(run, interrupted=interrupted, stay=serve_until_stopped and not interrupted,
                stopped=stopped)  # fmt: skip
    finally:  # whatever holds the process on its way out, it leaves (and says where it hung)
        exit_deadline("coordinator", 130 if interrupted else 0)


def _finish(run: DeviceRun, *, interrupted: bool, stay: bool, stopped: StopFlag) -> None:
    """Write the run's results, serve its final state if asked, stop the coordinator."""
    assert run.server is not None
    run_id, links = run.server.run_id, run.links
    results = run.collect(interrupted=interrupted, keep_serving=stay)
    if results is None:
        say(f"run {run_id} stopped before any agent reported a round; nothing written")
    else:
        console.print(summary_table(results, run.out_dir, links, title=f"run {run_id}"))
        write_summary(
            run.out_dir / "summary.txt", results, run.out_dir, links, title=f"run {run_id}"
        )
    if stay:
        say(f"run {run_id} complete; serving its final state until stopped (SIGTERM)")
        sys.stdout.flush()
        run.serve_until(stopped)
    if interrupted:
        if results is not None:
            say(f"interrupted: partial results in {run.out_dir}")
        raise typer.Exit(130)


def _dial(address: str) -> str:
    """The address agents dial: a wildcard host is this machine's name."""
    import socket

    host, _, port = address.rpartition(":")
    return f"{socket.gethostname()}:{port}" if host in ("0.0.0.0", "[::]", "::") else address


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
