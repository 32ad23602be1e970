"""``airgossip agent``: one edge agent over real gRPC, what runs on each device."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from airgossip.cli.certs import InsecureOption
from airgossip.cli.display import fail
from airgossip.cli.metrics_access import (
    MetricsPasswordFileOption,
    MetricsTlsOption,
    MetricsUserOption,
)

if TYPE_CHECKING:
    from airgossip.edge.observability.metrics import AgentMetrics
    from airgossip.node.links import KernelShaping, Links
    from airgossip.node.network import Network
    from airgossip.node.options import AgentProcessOptions
    from airgossip.scenario.config import RunConfig


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
        str | None,
        typer.Option(
            help="host:port peers should dial (default: the listen address); :PORT: this "
            "host's own address (a container's, on its network)."
        ),
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
    serve_until_stopped: Annotated[
        bool,
        typer.Option(
            "--serve-until-stopped",
            help="After the run and the linger, keep serving gossip and /metrics (the final "
            "round, accuracy...), idle, until SIGTERM or Ctrl-C: for devices and containers "
            "whose final state stays on the dashboards until the fleet is brought down.",
        ),
    ] = False,
    ready_timeout_s: Annotated[
        float,
        typer.Option(help="Longest wait for the coordinator, the fleet to fill or the peers."),
    ] = 120.0,
    parent_pid: Annotated[int | None, typer.Option(help="Exit when this process dies.")] = None,
    threads: Annotated[
        int | None,
        typer.Option(
            help="torch CPU threads (default: 1 for a model of up to a million parameters, "
            "else this host's cores shared among --host-agents)."
        ),
    ] = None,
    host_agents: Annotated[
        int | None,
        typer.Option(
            help="Agents that run on this host, this one included: they share its cores "
            "(default: 1).",
        ),
    ] = None,
    link_shaping: Annotated[
        bool,
        typer.Option(
            help="Emulate the network's links in the agent; --no-link-shaping where a kernel "
            "already shapes them."
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
        typer.Option(
            help="Keep checkpoints here and resume at start from the newest of this fleet, run "
            "and agent (others are refused, one line each; none usable: start fresh)."
        ),
    ] = None,
    checkpoint_interval_s: Annotated[
        float, typer.Option(help="Seconds between two checkpoints.")
    ] = 5.0,
    run_id: Annotated[
        str | None,
        typer.Option(
            help="With --peers: names this run, so that its checkpoints are never taken up by "
            "another run of the same scenario (default: a digest of the scenario and peer "
            "list). With --coordinator the coordinator names the run."
        ),
    ] = None,
    metrics_tls: MetricsTlsOption = False,
    metrics_user: MetricsUserOption = None,
    metrics_password_file: MetricsPasswordFileOption = None,
) -> None:
    """Run one edge agent over real gRPC (what runs on each device).

    On a device: --coordinator HOST:PORT --token TOKEN --index N is all it needs; the fleet's
    size and scenario come from the coordinator. Links are real: nothing is emulated unless
    the scenario's network table asks.
    """
    from airgossip.node.command import AgentCommand, check_command
    from airgossip.scenario.errors import ConfigError

    command = AgentCommand(
        config=config, agent_id=agent_id, index=index, listen=listen, advertise=advertise,
        coordinator=coordinator, peers=peers, token=token, metrics_listen=metrics_listen,
        metrics_advertise=metrics_advertise, metrics_tls=metrics_tls, metrics_user=metrics_user,
        metrics_password_file=metrics_password_file, stats_dir=stats_dir, linger_s=linger_s,
        serve_until_stopped=serve_until_stopped,
        ready_timeout_s=ready_timeout_s, parent_pid=parent_pid, threads=threads,
        host_agents=host_agents,
        link_shaping=link_shaping, kernel_links=kernel_links, device=device, certs=certs,
        insecure=insecure, checkpoint_dir=checkpoint_dir,
        checkpoint_interval_s=checkpoint_interval_s, run_id=run_id,
    )  # fmt: skip
    try:  # what the flags alone say is wrong, before torch and gRPC are imported
        check_command(command)
    except ConfigError as err:
        fail(str(err))
    from airgossip.cli.early import check_flags, check_scenario_file

    if config is not None and config.suffix != ".json":
        check_scenario_file(config)
    if device is not None:
        check_flags({"device": device})
    from airgossip.node.process import AgentProcessError, run_agent_command

    try:
        code = run_agent_command(command, device_links())
    except AgentProcessError as err:
        fail(str(err))
    raise typer.Exit(code)


def device_links() -> Links:
    """The links of an agent on a device: as they are (the scenario's topology, the emulation
    layer not loaded), or emulated where its scenario asks for an emulated loss, rate or
    radio (the emulation layer's networks and kernel link applier, loaded then)."""
    from airgossip.node.links import Links
    from airgossip.node.topology_network import TopologyNetwork

    def network_for(config: RunConfig) -> Network:
        if not config.emulates_links:
            return TopologyNetwork(config)
        from airgossip.emulation.networks import network_for as emulated

        return emulated(config)

    def kernel_links(
        network: Network, ids: list[str], options: AgentProcessOptions, metrics: AgentMetrics | None
    ) -> KernelShaping | None:
        from airgossip.emulation.networks.kernel.agent import agent_kernel_links

        return agent_kernel_links(network, ids, options, metrics)

    return Links(network_for, kernel_links)
