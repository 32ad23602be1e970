"""``airgossip run --mode ray`` with no address, as on a laptop: the command starts a local
Ray on loopback, runs the fleet as actors over mutual TLS and stops Ray at the end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_starts_a_local_ray_on_loopback_and_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "airgossip", "run", "--mode", "ray", "--task", "consensus",
         "--agents", "4", "--rounds", "30", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    final = json.loads((out / "results.json").read_text())["final"]
    assert final["complete"] and final["agents_reporting"] == 4
    assert final["relative_error"] < 1e-6
    report = json.loads((out / "ray.json").read_text())
    # One node, and everything on loopback: Ray's own address and every agent's.
    assert [n["address"] for n in report["nodes"]] == ["127.0.0.1"], report["nodes"]
    assert report["address"].startswith("127.0.0.1:"), report["address"]
    assert all(s[0]["node_ip"] == "127.0.0.1" for s in report["agents"].values())
    for index in range(4):
        log = (out / "logs" / f"agent-{index}.log").read_text()
        assert f"agent-{index} serving on 127.0.0.1:" in log, log
    assert sorted(p.name for p in (out / "certs" / "agent-0").iterdir()) == [
        "agent-0.key", "agent-0.pem", "ca.pem",
    ]  # fmt: skip
