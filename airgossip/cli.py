"""The ``airgossip`` command line: run a fleet, run one agent, run a coordinator."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(
    name="airgossip",
    help="Decentralized learning over directed, lossy links: gossip agents that need no server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
errors = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _default_out() -> Path:
    base = Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    out, n = base, 1
    while out.exists():
        out, n = Path(f"{base}-{n}"), n + 1
    return out


def _overrides(**flags: Any) -> dict[str, Any]:
    """Flag values given on the command line, shaped like the scenario file."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        if value is None:
            continue
        if key == "task":
            out.setdefault("task", {})["name"] = value
        elif key == "loss":
            out.setdefault("network", {})["loss"] = value
        else:
            out[key] = value
    return out


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if (abs(value) < 1e-3 and value) else f"{value:.{digits}f}"
    return str(value)


def _summary(results: dict[str, Any], out_dir: Path) -> Table:
    final, config = results["final"], results["config"]
    table = Table(title="airgossip run", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, Any]] = [
        (
            "fleet",
            f"{config['agents']} agents · {config['topology']} · {config['algorithm']} · "
            + ("" if config["compression"] == "none" else f"{config['compression']} · ")
            + f"{config['mode']}",
        ),
        ("task", config["task"]["name"]),
        ("mixing |λ2|", _fmt(config["lambda2"], 3)),
        ("rounds", f"{final['round']} of {config['rounds']}"),
    ]
    if final.get("mean_accuracy") is not None:
        rows.append(
            (
                "test accuracy",
                f"mean {_fmt(final['mean_accuracy'])} (min {_fmt(final['min_accuracy'])}, "
                f"max {_fmt(final['max_accuracy'])})",
            )
        )
    elif final.get("mean_loss") is not None:
        rows.append(("test loss", f"mean {_fmt(final['mean_loss'])}"))
    if final.get("relative_error") is not None:
        rows.append(("relative error", f"{final['relative_error']:.3e}"))
    rows += [
        ("consensus distance", _fmt(final.get("consensus_distance"))),
        (
            "messages",
            f"{final.get('messages_sent', 0)} sent, {final.get('messages_dropped', 0)} "
            f"lost ({_links(config)})",
        ),
        ("bytes sent", f"{final.get('bytes_sent', 0) / 1e6:.2f} MB"),
        *_wireless_rows(results),
        ("wall time", f"{results['total_wall_s']:.1f} s"),
        ("results", str(out_dir / "results.json")),
    ]
    for key, value in rows:
        table.add_row(key, str(value))
    return table


def _links(config: dict[str, Any]) -> str:
    wireless = config.get("wireless")
    if wireless:
        return f"wireless {wireless['name']}"
    return f"link loss {config['network']['loss']:g}"


def _wireless_rows(results: dict[str, Any]) -> list[tuple[str, Any]]:
    w = results.get("wireless")
    if not w:
        return []
    return [
        (
            "wireless links",
            f"{_fmt(w.get('mean_radio_links'), 1)} radio, {_fmt(w.get('mean_gossip_links'), 1)} "
            f"gossip (mean) · {w.get('graph_epochs')} graphs · strongly connected "
            f"{_fmt(w.get('strongly_connected_share'), 2)} of rounds · "
            f"{_fmt(w.get('emulated_s'), 1)} s emulated",
        )
    ]


def _scenario_base(scenario: str) -> dict[str, Any]:
    """A preset name or scenario file -> its settings (trace paths made absolute)."""
    from emulation.config import read_scenario
    from emulation.scenario import ScenarioNotFound, resolve_trace_paths, scenario_path

    try:
        path = scenario_path(scenario)
    except ScenarioNotFound as err:
        fail(str(err))
    return resolve_trace_paths(read_scenario(path), path.parent)


@app.command()
def run(
    agents: Annotated[int | None, typer.Option(help="Number of agents (default: 8).")] = None,
    topology: Annotated[
        str | None,
        typer.Option(
            help="complete, ring, directed-ring, exponential, one-peer-exponential, erdos-renyi, "
            "edges (default: exponential)."
        ),
    ] = None,
    task: Annotated[
        str | None, typer.Option(help="digits, consensus, or module:callable (default: digits).")
    ] = None,
    algorithm: Annotated[
        str | None,
        typer.Option(
            help="push-sum, push-sum-plain, dpsgd, quantized-push-sum, choco, "
            "gradient-tracking, local-sgd (default: push-sum)."
        ),
    ] = None,
    compression: Annotated[
        str | None,
        typer.Option(
            help="Codec of every message: none, fp16, bf16, qsgd:BITS (1-8), topk:FRACTION, "
            "randomk:FRACTION (default: none)."
        ),
    ] = None,
    rounds: Annotated[int | None, typer.Option(help="Rounds per agent (default: 40).")] = None,
    loss: Annotated[
        float | None,
        typer.Option(help="Message loss probability on every directed link (default: 0.1)."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of every random draw (default: 0).")
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(
            help="process (one OS process per agent, real gRPC) or inproc (default: process)."
        ),
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda (default: auto).")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Output folder (default: runs/<timestamp>).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML scenario file; flags override it.")
    ] = None,
    coordinator_port: Annotated[
        int, typer.Option(help="Port of the embedded coordinator (0: any free port).")
    ] = 0,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve the embedded coordinator's /metrics, /sd (Prometheus service "
            "discovery) and /fleet on this port (default: off)."
        ),
    ] = None,
    scenario: Annotated[
        str | None,
        typer.Option(
            help="Wireless scenario: a preset (wifi-indoor, wifi-outdoor-mobile, lte-urban) or "
            "a TOML file; --config and flags override it."
        ),
    ] = None,
    record: Annotated[
        bool, typer.Option("--record", help="Write replay logs of link states (wireless).")
    ] = False,
) -> None:
    """Run a fleet of agents locally and write results.json and a plot."""
    from emulation.config import ConfigError, load_config
    from emulation.fleet import FleetError, FleetProgress, refuse_used_out_dir, run_fleet

    overrides = _overrides(
        agents=agents, topology=topology, task=task, algorithm=algorithm, rounds=rounds,
        loss=loss, seed=seed, mode=mode, device=device, compression=compression,
    )  # fmt: skip
    if not 0 <= coordinator_port <= 65535:
        fail(f"--coordinator-port must be within 0..65535, got {coordinator_port}")
    if metrics_port is not None and not 0 < metrics_port <= 65535:
        fail(f"--metrics-port must be within 1..65535, got {metrics_port}")
    try:
        base = _scenario_base(scenario) if scenario is not None else None
        cfg = load_config(config, overrides, base=base)
    except ConfigError as err:
        fail(str(err))
    if record:
        if cfg.wireless is None:
            fail("--record needs a wireless scenario (--scenario NAME|FILE)")
        cfg = cfg.model_copy(update={"wireless": cfg.wireless.model_copy(update={"record": True})})
    out_dir = out or cfg.out or _default_out()
    try:
        refuse_used_out_dir(out_dir)
    except ConfigError as err:
        fail(str(err))
    if metrics_port is not None and cfg.mode != "process":
        fail("--metrics-port needs --mode process (agents with their own metrics endpoints)")
    if cfg.mode in ("inproc", "virtual"):
        import torch

        torch.set_num_threads(1)

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    bar = progress.add_task("starting", total=cfg.rounds, status="")
    last_print = [0.0]

    def on_progress(p: FleetProgress) -> None:
        if p.registered < p.agents:
            description, status = "starting agents", f"{p.registered}/{p.agents} registered"
        else:
            description = "training" if cfg.task.name != "consensus" else "gossiping"
            acc = f"acc {p.mean_accuracy:.3f} · " if p.mean_accuracy is not None else ""
            status = f"{acc}{p.messages_dropped}/{p.messages_sent} msgs lost"
        progress.update(bar, completed=p.slowest_round, description=description, status=status)
        if not console.is_terminal and time.monotonic() - last_print[0] > 5:
            last_print[0] = time.monotonic()
            console.print(f"{description}: round {p.slowest_round}/{p.rounds_total} {status}")

    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    links = (
        f"wireless {cfg.wireless.name}"
        if cfg.wireless is not None
        else f"{cfg.topology} · loss {cfg.network.loss:g}"
    )
    console.print(
        f"airgossip: {cfg.agents} agents · {links} · {cfg.algorithm} · task "
        f"{cfg.task.name} · {cfg.mode} · out {out_dir}",
        highlight=False,
    )
    try:
        with progress:
            results = run_fleet(
                cfg, out_dir, on_progress=on_progress,
                coordinator_listen=f"127.0.0.1:{coordinator_port}",
                coordinator_metrics_listen=(
                    f"127.0.0.1:{metrics_port}" if metrics_port is not None else None
                ),
            )  # fmt: skip
    except ConfigError as err:
        fail(str(err))
    except FleetError as err:
        fail(str(err), code=1)
    except OSError as err:
        if coordinator_port and "listen" in str(err):
            fail(f"{err}; pick another --coordinator-port or 0 for any free port")
        fail(str(err), code=1)
    except KeyboardInterrupt:
        errors.print(f"interrupted: agents stopped; partial results in {out_dir}")
        raise typer.Exit(130) from None
    console.print(_summary(results, out_dir))


@app.command()
def agent(
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Scenario file (TOML, or the config.json of a run)."),
    ] = None,
    agent_id: Annotated[
        str | None, typer.Option("--id", help="Agent id (default: agent-<index>).")
    ] = None,
    index: Annotated[int, typer.Option(help="Index of this agent (picks its data shard).")] = 0,
    listen: Annotated[str, typer.Option(help="host:port to serve gossip on.")] = "127.0.0.1:0",
    advertise: Annotated[
        str | None, typer.Option(help="host:port peers should dial (default: the listen address).")
    ] = None,
    coordinator: Annotated[str | None, typer.Option(help="Coordinator host:port.")] = None,
    peers: Annotated[
        Path | None,
        typer.Option(help='TOML file with a [peers] table of id = "host:port" (no coordinator).'),
    ] = None,
    token: Annotated[
        str, typer.Option(help="Join token of the coordinator.", envvar="AIRGOSSIP_TOKEN")
    ] = "",
    metrics_listen: Annotated[
        str | None,
        typer.Option(
            help="host:port for the Prometheus /metrics endpoint, or 'off' "
            "(default: the --listen host, any free port)."
        ),
    ] = None,
    metrics_advertise: Annotated[
        str | None,
        typer.Option(help="host:port scrapers should use (default: the advertised host)."),
    ] = None,
    stats_dir: Annotated[Path | None, typer.Option(help="Write round records here.")] = None,
    linger_s: Annotated[
        float, typer.Option(help="Keep serving this long after the last round.")
    ] = 10.0,
    ready_timeout_s: Annotated[float, typer.Option(help="Longest wait for neighbours.")] = 120.0,
    parent_pid: Annotated[int | None, typer.Option(help="Exit when this process dies.")] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads.")] = None,
) -> None:
    """Run one edge agent over real gRPC (what runs on each device)."""
    from airgossip.agent_process import (
        AgentProcessOptions,
        configure_process,
        die_with_parent,
        run_agent_process,
    )
    from emulation.config import ConfigError, load_config, read_scenario

    if parent_pid is not None:
        die_with_parent(parent_pid)
    if (coordinator is None) == (peers is None):
        fail("give exactly one of --coordinator HOST:PORT or --peers FILE")
    try:
        if config is not None and config.suffix == ".json":
            try:
                data = json.loads(config.read_text())
            except (OSError, json.JSONDecodeError) as err:
                fail(f"cannot read config {config}: {err}")
            cfg = load_config(None, data)
        else:
            cfg = load_config(config)
        peer_table: dict[str, str] | None = None
        if peers is not None:
            table = read_scenario(peers).get("peers")
            if not isinstance(table, dict) or not table:
                fail(f'{peers} needs a [peers] table of id = "host:port" entries')
            peer_table = {str(k): str(v) for k, v in table.items()}
    except ConfigError as err:
        fail(str(err))
    if not 0 <= index < cfg.agents:
        fail(f"--index {index} is outside the fleet of {cfg.agents} agents (0..{cfg.agents - 1})")
    configure_process(threads)
    options = AgentProcessOptions(
        agent_id=agent_id or f"agent-{index}", index=index, listen=listen, advertise=advertise,
        coordinator=coordinator, peers=peer_table, token=token, stats_dir=stats_dir,
        linger_s=linger_s, ready_timeout_s=ready_timeout_s,
        metrics_listen=None if metrics_listen == "off" else (
            metrics_listen or f"{listen.rpartition(':')[0]}:0"
        ),
        metrics_advertise=metrics_advertise,
    )  # fmt: skip
    from coordinator.client import CoordinatorError
    from edge.tasks import TaskError

    try:
        code = run_agent_process(cfg, options)
    except (OSError, CoordinatorError, TaskError, ConfigError, ValueError) as err:
        fail(str(err))
    raise typer.Exit(code)


@app.command()
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
) -> None:
    """Run the coordinator: membership, neighbour assignment, metrics and service discovery."""
    import logging

    from coordinator.membership import LivenessSettings
    from coordinator.policy import POLICIES, TopologySpec
    from coordinator.service import CoordinatorServer
    from coordinator.store import StoreError
    from edge.algorithms import algorithm_class
    from edge.topology import TopologyError
    from emulation.config import ConfigError, load_config
    from emulation.fleet import check_graph_fits, fleet_graph, topology_spec

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
        cfg = load_config(config, _overrides(agents=agents, topology=scenario_topology))
        if topology == "k-out":
            if not algorithm_class(cfg.algorithm).supports_directed:
                fail(f"algorithm '{cfg.algorithm}' needs an undirected graph; k-out is directed")
            spec = TopologySpec("k-out", seed=cfg.seed, out_degree=out_degree)
        else:
            check_graph_fits(cfg, fleet_graph(cfg))
            spec = topology_spec(cfg)
    except ConfigError as err:
        fail(str(err))
    host = listen.rpartition(":")[0]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        server = CoordinatorServer(
            expected=cfg.agents,
            topology=spec,
            listen=listen,
            token=token,
            db=db,
            liveness=liveness,
            metrics_listen=f"{host}:{metrics_port}",
        )
    except (OSError, StoreError, TopologyError) as err:
        fail(str(err))
    address = server.start()
    restored = "restored from " + str(db) if server.fleet.restored else "new fleet"
    console.print(
        f"coordinator on {address} ({restored}): {cfg.agents} agents, {spec.name}; "
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


@app.command("topology")
def topology_info(
    name: Annotated[str, typer.Argument(help="Topology name.")],
    agents: Annotated[int, typer.Option(help="Number of nodes.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed for random graphs.")] = 0,
) -> None:
    """Describe a topology: degree, period, connectivity and mixing |λ2|."""
    from edge.topology import TopologyError, build_graph, mixing_matrices, second_largest_eigenvalue

    try:
        graph = build_graph(name, agents, seed=seed)
    except TopologyError as err:
        fail(str(err))
    lam = second_largest_eigenvalue(mixing_matrices(graph))
    degrees = sorted({int(a.sum(axis=1).max()) for a in graph.phases})
    console.print(
        f"{name} on {agents} nodes: {'undirected' if graph.is_undirected else 'directed'}, "
        f"period {graph.period}, max out-degree {max(degrees)}, "
        f"{graph.edge_count() // graph.period} edges per round, |λ2| = {lam:.4f}"
    )


@app.command("links")
def links_command(
    scenario: Annotated[str, typer.Argument(help="Preset name or scenario TOML file.")],
    at: Annotated[float, typer.Option("--at", help="Seconds into the scenario.")] = 0.0,
    agents: Annotated[
        int | None, typer.Option(help="Number of agents (default: the scenario's).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (default: the scenario's).")] = None,
    png: Annotated[Path, typer.Option(help="Where to write the topology picture.")] = Path(
        "links.png"
    ),
    limit: Annotated[int, typer.Option(help="Rows of the table to print (0: all).")] = 40,
) -> None:
    """Print a wireless scenario's link table at one moment and draw its topology."""
    from emulation.config import ConfigError, load_config
    from emulation.link_report import link_report, plot_links
    from emulation.wireless_fleet import check_wireless

    if at < 0:
        fail(f"--at must be >= 0 seconds, got {at:g}")
    base = _scenario_base(scenario)
    try:
        cfg = load_config(None, _overrides(agents=agents, seed=seed), base=base)
        if cfg.wireless is None:
            fail(f"scenario '{scenario}' has no [wireless] table")
        check_wireless(cfg)
    except ConfigError as err:
        fail(str(err))
    report = link_report(cfg, at)
    assert cfg.wireless is not None
    graph = report.graph
    title = (
        f"{cfg.wireless.name} · {cfg.agents} agents · t = {at:g} s (step {report.step}) · "
        f"{graph.radio_links} radio links · {int(graph.adjacency.sum())} gossip links · "
        f"{'strongly connected' if graph.strongly_connected else f'{graph.components} components'}"
    )
    table = Table(title=title, title_justify="left")
    for column in ("from", "to", "dist m", "rx dBm", "SINR dB", "rate Mb/s", "goodput Mb/s",
                   "PER", "burst", "gossip"):  # fmt: skip
        table.add_column(column, justify="right" if column not in ("from", "to") else "left")
    shown = report.rows if limit <= 0 else report.rows[:limit]
    for r in shown:
        table.add_row(
            r.sender, r.receiver, f"{r.distance_m:.1f}", f"{r.rx_dbm:.1f}", f"{r.sinr_db:.1f}",
            f"{r.rate_mbps:.1f}", f"{r.goodput_mbps:.1f}", f"{r.per:.2g}",
            "bad" if r.bad else "good", "yes" if r.gossip else "",
        )  # fmt: skip
    console.print(table)
    if len(shown) < len(report.rows):
        console.print(f"… {len(report.rows) - len(shown)} more links (--limit 0 shows all)")
    plot_links(report, png, title)
    console.print(f"topology picture: {png}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
