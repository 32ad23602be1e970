"""``airgossip run --mode ray --ray-address ...`` ended from outside, on a real Ray cluster
of two nodes on loopback: Ctrl-C writes the partial results (marked interrupted), a killed
driver takes its actors with it, and neither leaves an agent's key behind; Ray's own output
goes to ``logs/ray.log``, not to the terminal."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.ray_support import agent_homes, leftovers, ray_cluster

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: What only Ray prints (its pushed messages and raylet dumps).
RAY_WORDS = ("(raylet)", "[state-dump]", "(gcs_server)")


@pytest.fixture()
def homes() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ag-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start_driver(address: str, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "airgossip", "run", "--mode", "ray", "--ray-address", address,
         "--task", "consensus", "--agents", "3", "--rounds", "100000", "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def training(homes: Path) -> int:
    """How many agents in the hosts' folders in ``homes`` have recorded a round."""
    records = homes.glob("airgossip-host-*/agent-*/records/agent-*.jsonl")
    return sum(1 for path in records if path.exists() and path.stat().st_size > 0)


def wait_for(check: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.5)
    return False


def test_ctrl_c_and_a_killed_driver_leave_no_key_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, homes: Path
) -> None:
    with ray_cluster(monkeypatch, nodes=2, homes=homes) as cluster:
        # Ctrl-C: partial results, marked interrupted; the actors' folders removed.
        out = tmp_path / "interrupted"
        driver = start_driver(cluster.address, out)
        try:
            assert wait_for(lambda: training(homes) == 3, 120), agent_homes(homes)
            assert wait_for(lambda: (out / "logs" / "ray.log").exists(), 30)
            time.sleep(5)  # a few rounds
            driver.send_signal(signal.SIGINT)
            stdout, stderr = driver.communicate(timeout=90)
        finally:
            driver.kill()
        assert driver.returncode == 130, stdout[-2000:] + stderr[-2000:]
        assert "partial results" in stderr, stderr[-2000:]
        results = json.loads((out / "results.json").read_text())
        assert results["interrupted"] and not results["final"]["complete"]
        assert results["final"]["agents_reporting"] == 3
        assert not [w for w in RAY_WORDS if w in stdout + stderr], stdout[-2000:] + stderr
        assert wait_for(lambda: not leftovers(homes), 15), leftovers(homes)

        # The driver killed (it cannot clean up): Ray ends its hosts, their folders go.
        driver = start_driver(cluster.address, tmp_path / "killed")
        try:
            assert wait_for(lambda: training(homes) == 3, 120), agent_homes(homes)
            time.sleep(3)
        finally:
            os.kill(driver.pid, signal.SIGKILL)
            driver.communicate(timeout=30)
        started = time.monotonic()
        assert wait_for(lambda: not leftovers(homes), 60), leftovers(homes)
        print(f"driver killed: its agents' folders gone after {time.monotonic() - started:.1f} s")
