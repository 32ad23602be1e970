"""``airgossip agent``: one edge agent over real gRPC, what runs on each device."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from airgossip.cli.certs import InsecureOption, require_transport_choice
from airgossip.cli.display import fail
from airgossip.cli.metrics_access import (
    MetricsPasswordFileOption,
    MetricsTlsOption,
    MetricsUserOption,
    metrics_security,
)


def agent(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Scenario file (TOML, or the config.json of a run). With --coordinator the "
            "agent runs the fleet's scenario and needs none; one given must agree with it.",
        ),
    ] = None,
    agent_id: Annotated[
        str | None, typer.Option("--id", help="Agent id (default: agent-<index>).")
    ] = None,
    index: Annotated[
        int, typer.Option(help="Index of this agent in the fleet (picks its data shard).")
    ] = 0,
    listen: Annotated[str, typer.Option(help="host:port to serve gossip on.")] = "127.0.0.1:0",
    advertise: Annotated[
        str | None, typer.Option(help="host:port peers should dial (default: the listen address).")
    ] = None,
    coordinator: Annotated[str | None, typer.Option(help="Coordinator host:port.")] = None,
    peers: Annotated[
        Path | None,
        typer.Option(
            help=escape('TOML file with a [peers] table of id = "host:port" (no coordinator).')
        ),
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
        float,
        typer.Option(
            help="Keep serving after the last round until every agent has finished, at most "
            "this long (with static peers: this long)."
        ),
    ] = 10.0,
    ready_timeout_s: Annotated[
        float,
        typer.Option(help="Longest wait for the coordinator, the fleet to fill or the peers."),
    ] = 120.0,
    parent_pid: Annotated[int | None, typer.Option(help="Exit when this process dies.")] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads.")] = None,
    link_shaping: Annotated[
        bool,
        typer.Option(
            help="Emulate the network's links in the agent (--no-link-shaping where a kernel "
            "already shapes them)."
        ),
    ] = True,
    kernel_links: Annotated[
        str | None,
        typer.Option(
            help="Emulate this agent's links with the kernel (tc, iptables) on this interface "
            "of its own network namespace, e.g. eth0 in a container (needs NET_ADMIN; in the "
            "agent where refused)."
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            help="Where this agent computes: auto (CUDA when torch sees a GPU), cpu or cuda "
            "(default: its scenario's, else auto)."
        ),
    ] = None,
    certs: Annotated[
        Path | None,
        typer.Option(
            help="Folder with ca.pem, <id>.pem and <id>.key (airgossip certs): mutual TLS with "
            "peers and the coordinator."
        ),
    ] = None,
    insecure: InsecureOption = False,
    checkpoint_dir: Annotated[
        Path | None,
        typer.Option(help="Keep checkpoints here and resume from the newest at start."),
    ] = None,
    checkpoint_interval_s: Annotated[
        float, typer.Option(help="Seconds between two checkpoints.")
    ] = 5.0,
    metrics_tls: MetricsTlsOption = False,
    metrics_user: MetricsUserOption = None,
    metrics_password_file: MetricsPasswordFileOption = None,
) -> None:
    """Run one edge agent over real gRPC (what runs on each device).

    On a device: --coordinator HOST:PORT --token TOKEN --index N is all it needs; the fleet's
    size and scenario come from the coordinator. Links are real: nothing is emulated unless
    the scenario's network table asks.
    """
    from airgossip.agent_process import (
        AgentProcessOptions,
        configure_process,
        die_with_parent,
        run_agent_process,
    )
    from edge.config.identity import agent_id as default_id
    from emulation.config import ConfigError, load_config, read_scenario

    if parent_pid is not None:
        die_with_parent(parent_pid)
    if (coordinator is None) == (peers is None):
        fail("give exactly one of --coordinator HOST:PORT or --peers FILE")
    require_transport_choice(certs, insecure)
    guard = metrics_security(
        certs, agent_id or default_id(index), metrics_tls, metrics_user, metrics_password_file
    )
    if not checkpoint_interval_s > 0:
        fail(f"--checkpoint-interval-s must be positive, got {checkpoint_interval_s:g}")
    if peers is not None and config is None:
        fail("--peers needs --config (the scenario every agent of the list runs)")
    if kernel_links is not None and not link_shaping:
        fail("--kernel-links shapes the links: it cannot go with --no-link-shaping")
    declared: dict[str, Any] | None = None
    cfg = None
    try:
        if config is not None and config.suffix == ".json":
            try:
                declared = json.loads(config.read_text())
            except (OSError, json.JSONDecodeError) as err:
                fail(f"cannot read config {config}: {err}")
            if not isinstance(declared, dict):
                fail(f"config {config} is not a JSON object of settings")
            cfg = load_config(None, declared)
        elif config is not None:
            declared = read_scenario(config)
            cfg = load_config(config, real_links=True)
        peer_table: dict[str, str] | None = None
        if peers is not None:
            table = read_scenario(peers).get("peers")
            if not isinstance(table, dict) or not table:
                fail(f'{peers} needs a [peers] table of id = "host:port" entries')
            peer_table = {str(k): str(v) for k, v in table.items()}
        if device is not None:
            # The agent's own choice (a setting each agent makes for itself).
            declared = {**(declared or {}), "device": device}
            cfg = cfg.model_copy(update={"device": device}) if cfg is not None else None
            load_config(None, {"device": device})  # a bad value fails here, with the others
    except ConfigError as err:
        fail(str(err))
    if index < 0:
        fail(f"--index must be 0 or more, got {index}")
    configure_process(threads)
    options = AgentProcessOptions(
        agent_id=agent_id or default_id(index), index=index, listen=listen, advertise=advertise,
        coordinator=coordinator, peers=peer_table, token=token, stats_dir=stats_dir,
        linger_s=linger_s, ready_timeout_s=ready_timeout_s,
        metrics_listen=None if metrics_listen == "off" else (
            metrics_listen or f"{listen.rpartition(':')[0]}:0"
        ),
        metrics_advertise=metrics_advertise, metrics_security=guard, shape_links=link_shaping,
        declared=declared,
        kernel_device=kernel_links,
        certs=certs, checkpoint_dir=checkpoint_dir, checkpoint_interval_s=checkpoint_interval_s,
    )  # fmt: skip
    from coordinator.client import CoordinatorError
    from edge.tasks import TaskError

    try:
        code = run_agent_process(cfg, options)
    except (OSError, CoordinatorError, TaskError, ConfigError, ValueError) as err:
        fail(str(err))
    raise typer.Exit(code)
