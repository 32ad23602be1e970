"""A run's folder keeps its secrets: the throwaway CA key is never written, each agent gets a
folder with only its own key and the CA's certificate, keys are 0600 in 0700 folders, and
so are the agents' checkpoints."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from airgossip.common.security.tls import COORDINATOR_IDENTITY, SecurityError, TlsCredentials
from airgossip.emulation.fleets.base import ProgressKeeper
from airgossip.emulation.fleets.processes import AgentProcesses
from airgossip.node.command import AgentCommand
from airgossip.node.folder import RunFolder
from airgossip.scenario.config import load_config


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_each_member_gets_its_own_key_and_the_ca_key_is_never_written(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "run")
    members = ["agent-0", "agent-1", COORDINATOR_IDENTITY]
    folder.issue_credentials(members)
    every_file = [p for p in folder.path.rglob("*") if p.is_file()]
    assert not [p for p in every_file if p.name == "ca.key"]
    assert [p.name for p in every_file if p.parent == folder.certs_dir] == ["ca.pem"]
    assert mode(folder.certs_dir) == 0o700
    for member in members:
        own = folder.credentials(member)
        assert sorted(p.name for p in own.iterdir()) == sorted(
            ["ca.pem", f"{member}.pem", f"{member}.key"]
        )
        assert mode(own) == 0o700 and mode(own / f"{member}.key") == 0o600
        TlsCredentials.load(own, member)  # issued by the CA it holds, valid now, its key
    # Another run's authority is another trust domain.
    other = RunFolder(tmp_path / "other")
    other.issue_credentials(["agent-0"])
    (folder.credentials("agent-0") / "ca.pem").write_bytes(
        (other.credentials("agent-0") / "ca.pem").read_bytes()
    )
    with pytest.raises(SecurityError):
        TlsCredentials.load(folder.credentials("agent-0"), "agent-0")


def test_an_agent_process_is_handed_only_its_own_credentials(tmp_path: Path) -> None:
    config = load_config(None, {"agents": 3, "mode": "process"})
    folder = RunFolder(tmp_path / "run")
    group = AgentProcesses(config, folder, ProgressKeeper(config, None), fork_server=False)
    commands = [group.command(i, f"agent-{i}", AgentCommand(coordinator="h:1")) for i in range(3)]
    for i, command in enumerate(commands):
        assert command.certs == folder.credentials(f"agent-{i}") and not command.insecure
        assert command.checkpoint_dir == folder.checkpoints_dir / f"agent-{i}"
        assert mode(command.checkpoint_dir) == 0o700
        assert command.config == folder.config_path and command.coordinator == "h:1"
    assert mode(folder.checkpoints_dir) == 0o700
    assert group.coordinator_credentials() is not None
    plain = AgentProcesses(
        config, RunFolder(tmp_path / "plain"), ProgressKeeper(config, None), insecure=True,
        fork_server=False,
    )  # fmt: skip
    command = plain.command(0, "agent-0", AgentCommand(coordinator="h:1"))
    assert command.insecure and command.certs is None
    assert not (tmp_path / "plain" / "certs").exists()
