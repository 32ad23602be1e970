"""Agents on other hosts: each device in a network namespace of its own (its own address on
a bridge), joining a coordinator on a third with a join token over mutual TLS (each device
with its own certificate, issued as the unit's comment says), advertising the address the
others reach it at, started with the command line of ``deploy/systemd/airgossip-agent.service``.
The unit itself passes ``systemd-analyze verify``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from airgossip.emulation.networks.kernel import NamespaceNetwork, kernel_support
from tests.support.cli import ROOT, cli
from tests.support.processes import wait_until_gone

UNIT = ROOT / "deploy" / "systemd" / "airgossip-agent.service"
ENV = ROOT / "deploy" / "systemd" / "agent.env.example"
TOKEN = "device-fleet-token"
SUPPORT = kernel_support()


def unit_command(env: dict[str, str]) -> list[str]:
    """The unit's ExecStart, its variables filled from ``env``."""
    text = UNIT.read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    words = shlex.split(line.removeprefix("ExecStart="))
    return [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], word) for word in words]


def example_env() -> dict[str, str]:
    lines = [line for line in ENV.read_text().splitlines() if "=" in line]
    return dict(line.split("=", 1) for line in lines if not line.startswith("#"))


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    airgossip = shutil.which("airgossip")
    assert airgossip, "the airgossip command is not installed (pip install -e .)"
    unit = tmp_path / "airgossip-agent.service"
    unit.write_text(UNIT.read_text().replace("/opt/airgossip/bin/airgossip", airgossip))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    # Restarted when it fails, not when its run is over.
    assert re.search(r"^Restart=on-failure$", UNIT.read_text(), re.M)
    # Every variable the command uses is in the example settings.
    assert set(re.findall(r"\$\{(\w+)\}", UNIT.read_text())) <= set(example_env())


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not SUPPORT.available, reason=SUPPORT.reason or "no kernel support")
def test_agents_on_other_hosts_join_with_a_token_and_their_advertised_address(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text('agents = 2\nrounds = 15\ntopology = "complete"\n[network]\nloss = 0.0\n')
    # The fleet's authority on one machine; each device gets a folder with only its own
    # certificate and key and ca.pem (what the unit's comment copies to /etc/airgossip/certs).
    authority = tmp_path / "fleet-ca"
    devices = {name: tmp_path / "devices" / name for name in ("coordinator", "agent-0", "agent-1")}
    assert cli("certs", "init", "--dir", str(authority)).returncode == 0
    for name, folder in devices.items():
        issued = cli("certs", "issue", name, "--dir", str(authority), "--out", str(folder))
        assert issued.returncode == 0, issued.stdout
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            ["ca.pem", f"{name}.pem", f"{name}.key"]
        )
    procs: list[subprocess.Popen[bytes]] = []
    with NamespaceNetwork(4, tag="agdev") as hosts:
        coordinator_host = hosts.addresses[0]

        def start(host: int, command: list[str], log: str) -> subprocess.Popen[bytes]:
            with (tmp_path / log).open("wb") as out:
                proc = subprocess.Popen(
                    [*hosts.exec_prefix(host), *command], stdout=out, stderr=subprocess.STDOUT,
                    env={**os.environ, "AIRGOSSIP_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"},
                )  # fmt: skip
            procs.append(proc)
            return proc

        try:
            start(0, [sys.executable, "-m", "airgossip", "coordinator", "--listen",
                      f"{coordinator_host}:7070", "--metrics-port", "9470", "--config",
                      str(scenario), "--out", str(tmp_path / "results"),
                      "--certs", str(devices["coordinator"])],
                  "coordinator.log")  # fmt: skip
            agents = []
            for index, host in ((0, 1), (1, 2)):
                env = {
                    **example_env(),
                    "AIRGOSSIP_COORDINATOR": f"{coordinator_host}:7070",
                    "AIRGOSSIP_INDEX": str(index),
                    "AIRGOSSIP_ADVERTISE": f"{hosts.addresses[host]}:7000",
                    "AIRGOSSIP_THREADS": "1",
                }
                command = unit_command(env)
                # This checkout's airgossip, its files where the test keeps them.
                command[0:1] = [sys.executable, "-m", "airgossip"]
                command[command.index("--stats-dir") + 1] = str(tmp_path / "records")
                command[command.index("--certs") + 1] = str(devices[f"agent-{index}"])
                command[command.index("--checkpoint-dir") + 1] = str(tmp_path / "checkpoints")
                agents.append(start(host, [*command, "--linger-s", "5"], f"agent-{index}.log"))
            # A device with the wrong token is refused, with one line naming why.
            wrong = subprocess.run(
                [*hosts.exec_prefix(3), sys.executable, "-m", "airgossip", "agent",
                 "--coordinator", f"{coordinator_host}:7070", "--token", "wrong",
                 "--index", "1", "--listen", "0.0.0.0:7000",
                 "--certs", str(devices["agent-1"]),
                 "--advertise", f"{hosts.addresses[3]}:7000", "--ready-timeout-s", "20"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert wrong.returncode != 0
            assert "token" in wrong.stderr.lower() or "UNAUTHENTICATED" in wrong.stderr
            assert "Traceback" not in wrong.stderr
            for agent in agents:
                assert agent.wait(timeout=200) == 0, (tmp_path / "agent-0.log").read_text()[-2000:]
            # The run is complete: the coordinator writes its results and exits.
            assert procs[0].wait(timeout=120) == 0, (tmp_path / "coordinator.log").read_text()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
    records = {}
    for index in range(2):
        lines = (tmp_path / "records" / f"agent-{index}.jsonl").read_text().splitlines()
        records[index] = json.loads(lines[-1])
    assert all(r["final"] and r["round"] == 15 for r in records.values())
    assert all(r["metrics"]["accuracy"] > 0.8 for r in records.values())
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert results["final"]["round"] == 15 and results["final"]["messages_dropped"] == 0
    log = (tmp_path / "coordinator.log").read_text()
    # The coordinator dialled the devices at their advertised addresses.
    assert f"agent-0 joined from {hosts.addresses[1]}:7000" in log
    assert f"agent-1 joined from {hosts.addresses[2]}:7000" in log
    assert not wait_until_gone("agdev-")
