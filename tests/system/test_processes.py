"""Real OS processes over real gRPC: a launched fleet, Ctrl-C, orphans, static peers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from airgossip.edge.observability.stats import read_records
from airgossip.edge.tasks.consensus import ConsensusOptions, true_average
from tests.support.cli import ROOT, airgossip
from tests.support.processes import free_port, kill_all, wait_until_gone
from tests.support.tls import credentials_folder

pytestmark = pytest.mark.slow


def test_process_fleet_is_exact_under_loss(tmp_path: Path) -> None:
    out = tmp_path / "run"
    try:
        result = airgossip(
            "run", "--task", "consensus", "--agents", "6", "--topology", "exponential",
            "--loss", "0.3", "--rounds", "60", "--out", str(out),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr + result.stdout
        results = json.loads((out / "results.json").read_text())
        final = results["final"]
        assert final["complete"] and final["agents_reporting"] == 6
        assert final["relative_error"] < 1e-6
        assert final["messages_dropped"] > 0.15 * final["messages_sent"]
        assert results["config"]["mode"] == "process"
        logs = sorted(p.name for p in (out / "logs").iterdir())
        assert logs == [f"agent-{i}.log" for i in range(6)]
        # Mutual TLS with a throwaway authority whose key was never written: each agent's
        # folder holds its own key (0600, in a 0700 folder) and the CA's certificate.
        assert not list(out.rglob("ca.key"))
        own = out / "certs" / "agent-0"
        assert sorted(p.name for p in own.iterdir()) == ["agent-0.key", "agent-0.pem", "ca.pem"]
        assert (own / "agent-0.key").stat().st_mode & 0o077 == 0
        for private in (own, out / "checkpoints", out / "checkpoints" / "agent-0"):
            assert private.stat().st_mode & 0o077 == 0, private
        assert wait_until_gone(str(out)) == []
    finally:
        kill_all(str(out))


def _launch(out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "airgossip", "run", "--task", "consensus", "--agents", "3",
         "--rounds", "100000", "--out", str(out), *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _wait_for_rounds(out: Path, launcher: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = list((out / "agents").glob("*.jsonl")) if (out / "agents").exists() else []
        if len(files) == 3 and all(f.stat().st_size > 0 for f in files):
            return
        assert launcher.poll() is None, launcher.communicate()
        time.sleep(0.2)
    raise AssertionError("agents never started their rounds")


def test_ctrl_c_stops_every_process_and_keeps_partial_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    launcher = _launch(out)
    try:
        _wait_for_rounds(out, launcher)
        launcher.send_signal(signal.SIGINT)
        stdout, stderr = launcher.communicate(timeout=30)
        assert launcher.returncode == 130, stderr
        assert "Traceback" not in stderr + stdout
        assert "interrupted" in stderr
        assert wait_until_gone(str(out)) == []
        results = json.loads((out / "results.json").read_text())
        assert results["interrupted"] is True and results["final"]["round"] > 0
    finally:
        launcher.kill()
        kill_all(str(out))


def test_killed_launcher_leaves_no_orphans(tmp_path: Path) -> None:
    out = tmp_path / "run"
    launcher = _launch(out)
    try:
        _wait_for_rounds(out, launcher)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        assert wait_until_gone(str(out), timeout=15) == []
    finally:
        kill_all(str(out))


def test_agents_run_from_a_static_peer_list_without_a_coordinator(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    peers = tmp_path / "peers.toml"
    peers.write_text(
        "[peers]\n" + "".join(f'agent-{i} = "127.0.0.1:{p}"\n' for i, p in enumerate(ports))
    )
    scenario = tmp_path / "scenario.toml"
    # Three agents on a directed ring start a few seconds apart and mix asynchronously: the
    # error shrinks by roughly 0.7 per round, so 1e-6 needs well over 40 rounds.
    scenario.write_text(
        'agents = 3\nrounds = 120\ntopology = "directed-ring"\n'
        '[task]\nname = "consensus"\ndim = 6\n[network]\nloss = 0.2\n'
    )
    stats = tmp_path / "stats"
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airgossip",
                "agent",
                "--config",
                str(scenario),
                "--index",
                str(i),
                "--listen",
                f"127.0.0.1:{port}",
                "--peers",
                str(peers),
                "--stats-dir",
                str(stats),
                "--linger-s",
                "2",
                "--parent-pid",
                str(os.getpid()),
                "--certs",
                str(credentials_folder()),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i, port in enumerate(ports)
    ]
    try:
        for agent in agents:
            output, _ = agent.communicate(timeout=180)
            assert agent.returncode == 0, output
        target = true_average(0, 3, ConsensusOptions(dim=6)).numpy()
        for i in range(3):
            final = [r for r in read_records(stats, f"agent-{i}") if r.final][-1]
            assert final.round == 120
            assert final.estimate is not None
            error = np.linalg.norm(final.estimate - target) / np.linalg.norm(target)
            assert error < 1e-6, (i, error)
    finally:
        for agent in agents:
            agent.kill()
