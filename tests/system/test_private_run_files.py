"""Everything a run writes, and every folder ``airgossip certs`` makes, is its owner's only
(files 0600, folders 0700) even under a umask of 000: real commands, as users run them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.support.cli import ROOT


def airgossip_umask_000(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m airgossip ARGS`` in a process whose umask is 000 (everything it and its
    children create would be world-writable but for the modes they ask for)."""
    return subprocess.run(
        [sys.executable, "-m", "airgossip", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, umask=0,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def not_private(folder: Path) -> list[str]:
    """What under ``folder`` (itself included) is not a 0700 folder or a 0600 file."""
    wrong = []
    for path in [folder, *folder.rglob("*")]:
        info = path.lstat()
        mode = stat.S_IMODE(info.st_mode)
        expected = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600
        if mode != expected:
            wrong.append(f"{path.relative_to(folder)}: {oct(mode)}")
    return wrong


def test_process_run_writes_only_private_files(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "run"
    result = airgossip_umask_000(
        "run", "--mode", "process", "--agents", "3", "--rounds", "5", "--task", "consensus",
        "--topology", "ring", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    written = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    for name in (
        "config.json", "results.json", "results.png", "agents/agent-0.estimates",
        "agents/agent-0.jsonl", "logs/agent-0.log", "certs/agent-0/agent-0.key",
        "checkpoints/agent-0",
    ):  # fmt: skip
        assert name in written, sorted(written)
    assert not_private(out) == []
    assert stat.S_IMODE((tmp_path / "runs").stat().st_mode) == 0o700  # a parent it made


def test_wireless_run_logs_are_private(tmp_path: Path) -> None:
    scenario = tmp_path / "wireless.toml"
    scenario.write_text(
        'agents = 3\nrounds = 4\nmode = "virtual"\n[task]\nname = "consensus"\n'
        "[wireless]\nrecord = true\n"
    )
    out = tmp_path / "run"
    result = airgossip_umask_000("run", "--config", str(scenario), "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "links.jsonl").exists() and (out / "messages.jsonl").exists()
    assert not_private(out) == []


def test_certs_init_and_issue_make_private_folders(tmp_path: Path) -> None:
    ca, device = tmp_path / "fleet" / "ca", tmp_path / "devices" / "agent-3"
    assert airgossip_umask_000("certs", "init", "--dir", str(ca)).returncode == 0
    issued = airgossip_umask_000(
        "certs", "issue", "agent-3", "--dir", str(ca), "--out", str(device)
    )
    assert issued.returncode == 0, issued.stdout + issued.stderr
    for folder in (tmp_path / "fleet", ca, tmp_path / "devices", device):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    for key in (ca / "ca.key", device / "agent-3.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert sorted(p.name for p in device.iterdir()) == ["agent-3.key", "agent-3.pem", "ca.pem"]
    assert not [p for p in tmp_path.rglob(".*.tmp")]


def test_certs_issue_keeps_the_mode_of_a_folder_the_user_made(tmp_path: Path) -> None:
    ca, device = tmp_path / "ca", tmp_path / "etc-certs"
    device.mkdir()
    os.chmod(device, 0o750)  # a device's /etc/airgossip/certs, readable by a service group
    assert airgossip_umask_000("certs", "init", "--dir", str(ca)).returncode == 0
    issued = airgossip_umask_000(
        "certs", "issue", "agent-1", "--dir", str(ca), "--out", str(device)
    )
    assert issued.returncode == 0, issued.stdout + issued.stderr
    assert stat.S_IMODE(device.stat().st_mode) == 0o750
    assert stat.S_IMODE((device / "agent-1.key").stat().st_mode) == 0o600
