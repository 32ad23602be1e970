"""From an agent's command line to what its process runs: the flags checked, its scenario
and peer list read, its options resolved (addresses, metrics, what it declares to a coordinator).
Every bad flag or file is a :class:`~airgossip.scenario.config.ConfigError` of one line."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

from airgossip.common.http import HttpSecurity, http_security
from airgossip.common.identity import agent_id as default_agent_id
from airgossip.node.command import AgentCommand, check_command
from airgossip.scenario.config import ConfigError, RunConfig, Settings, load_config, read_scenario


@dataclass(frozen=True)
class AgentProcessOptions:
    """What one agent process runs with, resolved from its command line."""

    agent_id: str
    index: int
    listen: str = "127.0.0.1:0"
    advertise: str | None = None
    coordinator: str | None = None
    peers: dict[str, str] | None = None
    token: str = ""
    stats_dir: Path | None = None
    linger_s: float = 10.0
    #: After the run (and the linger), keep serving gossip and metrics, idle, until told to
    #: stop: a device or container whose final state stays on the dashboards.
    serve_until_stopped: bool = False
    ready_timeout_s: float = 120.0
    #: host:port of the Prometheus endpoint (None: no metrics); port 0 picks a free port.
    metrics_listen: str | None = None
    #: host:port scrapers should use [default: the advertised host, the bound port].
    metrics_advertise: str | None = None
    #: TLS and basic auth in front of the metrics port (None: plain HTTP).
    metrics_security: HttpSecurity | None = None
    #: Shape the links in the agent (off where a kernel shapes them).
    shape_links: bool = True
    #: The settings the agent was started with, as written (its scenario file): a coordinator
    #: refuses the agent if any disagrees with the fleet's; with static peers, the fleet size
    #: comes from the peer list unless they set it. None: nothing declared.
    declared: Settings | None = None
    #: Longest wait for the coordinator to take the last round reports.
    report_timeout_s: float = 30.0
    #: Shape this agent's links in the kernel on this interface of its own network
    #: namespace (a container with NET_ADMIN); in the agent where that is refused.
    kernel_device: str | None = None
    #: Folder of the agent's TLS credentials (ca.pem, <id>.pem, <id>.key); None: plaintext.
    certs: Path | None = None
    #: Where the agent keeps its checkpoints and resumes from (None: it keeps none).
    checkpoint_dir: Path | None = None
    checkpoint_interval_s: float = 5.0
    #: The run its checkpoints are bound to, as the operator names it (static peers only;
    #: None: the coordinator's run id, or a digest of the scenario and the peer list).
    run_id: str | None = None
    #: torch CPU threads (None: from the model's size and ``host_agents``, see
    #: :mod:`airgossip.node.threads`).
    threads: int | None = None
    #: Agents that run on this host, this one included (None: unknown).
    host_agents: int | None = None


def own_address() -> str:
    """This host's own address, as its name resolves (a container's, on its network)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as err:
        raise ConfigError(f"--advertise :PORT: this host's name does not resolve ({err})") from None


def _scenario(config: Path) -> tuple[RunConfig, Settings]:
    """A scenario file (TOML, or a run's ``config.json``): the config and what it declares."""
    if config.suffix != ".json":
        return load_config(config, real_links=True), read_scenario(config)
    try:
        declared = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read config {config}: {err}") from None
    if not isinstance(declared, dict):
        raise ConfigError(f"config {config} is not a JSON object of settings")
    return load_config(None, declared), declared


def _peer_table(peers: Path) -> dict[str, str]:
    table = read_scenario(peers).get("peers")
    if not isinstance(table, dict) or not table:
        raise ConfigError(f'{peers} needs a [peers] table of id = "host:port" entries')
    return {str(k): str(v) for k, v in table.items()}


def agent_options(command: AgentCommand) -> tuple[RunConfig | None, AgentProcessOptions]:
    """The agent's own config (None: it runs the coordinator's) and its process options."""
    check_command(command)
    declared: Settings | None = None
    config: RunConfig | None = None
    if command.config is not None:
        config, declared = _scenario(command.config)
    peers = _peer_table(command.peers) if command.peers is not None else None
    if command.device is not None:
        # The agent's own choice (a setting each agent makes for itself).
        load_config(None, {"device": command.device})  # a bad value fails here
        declared = {**(declared or {}), "device": command.device}
        if config is not None:
            config = config.model_copy(update={"device": command.device})
    advertise = command.advertise
    if advertise is not None and advertise.startswith(":"):
        advertise = f"{own_address()}{advertise}"
    metrics = command.metrics_listen or f"{command.listen.rpartition(':')[0]}:0"
    agent_id = command.agent_id or default_agent_id(command.index)
    guard = http_security(
        command.certs, agent_id, tls=command.metrics_tls, user=command.metrics_user,
        password_file=command.metrics_password_file,
    )  # fmt: skip
    options = AgentProcessOptions(
        agent_id=agent_id, index=command.index,
        listen=command.listen, advertise=advertise, coordinator=command.coordinator,
        peers=peers, token=command.token, stats_dir=command.stats_dir,
        linger_s=command.linger_s, serve_until_stopped=command.serve_until_stopped,
        ready_timeout_s=command.ready_timeout_s,
        metrics_listen=None if metrics == "off" else metrics,
        metrics_advertise=command.metrics_advertise, metrics_security=guard,
        shape_links=command.link_shaping,
        declared=declared, kernel_device=command.kernel_links, certs=command.certs,
        checkpoint_dir=command.checkpoint_dir,
        checkpoint_interval_s=command.checkpoint_interval_s, run_id=command.run_id,
        threads=command.threads, host_agents=command.host_agents,
    )  # fmt: skip
    return config, options
