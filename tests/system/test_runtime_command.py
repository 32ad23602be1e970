"""An agent process's command line: what fleets write is what the agent reads, the runtime's
entry point takes exactly ``airgossip agent``'s flags, bad flags are one line, and a
container runs the agent module with only its own credentials."""

from __future__ import annotations

import socket
from dataclasses import fields
from pathlib import Path

import click
import pytest
import typer.main

from airgossip.cli import app
from airgossip.emulation.agent import main as agent_main
from airgossip.emulation.fleets.agent_server import AGENT_MODULE
from airgossip.emulation.fleets.base import Launch
from airgossip.emulation.fleets.containers import ContainerFleet
from airgossip.emulation.networks import network_for
from airgossip.node.command import (
    AgentCommand,
    flag_name,
    parse_agent_command,
)
from airgossip.node.folder import RunFolder
from airgossip.node.options import agent_options
from airgossip.scenario.config import ConfigError, load_config
from airgossip.scenario.modes.containers import ContainerSettings


def test_what_a_fleet_writes_is_what_the_agent_reads(tmp_path: Path) -> None:
    command = AgentCommand(
        config=tmp_path / "config.json", agent_id="agent-3", index=3,
        coordinator="127.0.0.1:7070", stats_dir=tmp_path / "agents", linger_s=3600.0,
        parent_pid=1234, threads=1, link_shaping=False, kernel_links="eth0",
        insecure=True, checkpoint_dir=tmp_path / "checkpoints" / "agent-3",
    )  # fmt: skip
    argv = command.argv()
    assert parse_agent_command(argv) == command
    # Only what differs from the defaults is written; a flag that is off says so.
    assert "--no-link-shaping" in argv and "--listen" not in argv
    assert parse_agent_command([]) == AgentCommand()


def test_the_entry_point_takes_exactly_the_flags_of_airgossip_agent() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    cli = {p.name: p for p in group.commands["agent"].params if isinstance(p, click.Option)}
    runtime = {f.name: f for f in fields(AgentCommand)}
    assert set(cli) == set(runtime)
    for name, field in runtime.items():
        assert cli[name].opts == [flag_name(name)], name
        assert cli[name].default == field.default, name
    assert cli["link_shaping"].secondary_opts == ["--no-link-shaping"]


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--coordinator", "h:1", "--peers", "p.toml", "--insecure"],
         "give exactly one of --coordinator HOST:PORT or --peers FILE"),
        (["--coordinator", "h:1"], "give exactly one of --certs DIR"),
        (["--coordinator", "h:1", "--insecure", "--index", "-1"], "--index must be 0 or more"),
        (["--coordinator", "h:1", "--insecure", "--kernel-links", "eth0", "--no-link-shaping"],
         "--kernel-links shapes the links"),
        (["--coordinator", "h:1", "--insecure", "--device", "tpu"], "device"),
        (["--index", "three"], "argument --index: invalid int value: 'three'"),
    ],
)  # fmt: skip
def test_a_bad_command_line_is_one_error_line(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        raise SystemExit(agent_main(argv))
    assert ended.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and error in lines[0], lines


def test_advertising_a_port_alone_advertises_this_hosts_own_address() -> None:
    _, options = agent_options(
        AgentCommand(coordinator="h:1", insecure=True, listen="0.0.0.0:7000", advertise=":7000")
    )
    assert options.advertise == f"{socket.gethostbyname(socket.gethostname())}:7000"
    _, given = agent_options(AgentCommand(coordinator="h:1", insecure=True, advertise="a:1"))
    assert given.advertise == "a:1"
    assert given.metrics_listen == "127.0.0.1:0"  # the listen host, any port
    _, off = agent_options(AgentCommand(coordinator="h:1", insecure=True, metrics_listen="off"))
    assert off.metrics_listen is None


def test_a_scenario_the_agent_declares_is_read_once(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text("agents = 3\n[network]\nloss = 0.2\n")
    config, options = agent_options(
        AgentCommand(config=scenario, coordinator="h:1", insecure=True, device="cpu", index=2)
    )
    assert config is not None and config.agents == 3 and config.device == "cpu"
    assert options.declared == {"agents": 3, "network": {"loss": 0.2}, "device": "cpu"}
    assert options.agent_id == "agent-2"
    with pytest.raises(ConfigError, match="needs a \\[peers\\] table"):
        agent_options(AgentCommand(config=scenario, peers=scenario, insecure=True))


def test_a_container_runs_the_agent_module_with_only_its_own_credentials(tmp_path: Path) -> None:
    """What the container fleet hands Docker, checked without an engine (tests/deploy runs
    it): the image's entry point cleared, the agent module, paths as the container sees
    them, and only the agent's own credentials mounted."""
    config = load_config(None, {"agents": 2, "mode": "containers"})
    folder = RunFolder(tmp_path / "run")
    fleet = ContainerFleet(config, network_for(config), Launch(folder.path, folder.config_path))
    docker = fleet._docker_run("agent-1")
    image = docker.index(config.mode_settings(ContainerSettings).image)
    assert docker[image - 2 : image] == ["--entrypoint", ""] and docker[-1] == docker[image]
    mounts = [docker[i + 1] for i, arg in enumerate(docker) if arg == "--volume"]
    own = folder.credentials("agent-1")
    assert sorted(m for m in mounts if m.startswith(str(folder.certs_dir))) == [
        f"{own / name}:/airgossip/certs/{name}:ro"
        for name in ("agent-1.key", "agent-1.pem", "ca.pem")
    ]
    command = fleet.agents.command(1, "agent-1", AgentCommand(coordinator="172.18.0.1:7070"))
    assert fleet.agents.host.command == ("python", "-m", AGENT_MODULE)
    parsed = parse_agent_command(command.argv())
    assert parsed.certs == Path("/airgossip/certs") and not parsed.insecure
    assert parsed.config == Path("/airgossip/run/config.json")
    assert parsed.stats_dir == Path("/airgossip/run/agents")
    assert parsed.checkpoint_dir == Path("/airgossip/run/checkpoints/agent-1")
    assert parsed.parent_pid is None  # another process namespace
