"""``airgossip baseline flower`` right after ``./scripts/run``: the extra it needs is
installed on first use (after one line saying so), and its progress shows the real total.

Ray cannot be uninstalled on a shared machine to try the first use for real, so its absence
is simulated in the CLI's process only (``sys.modules['ray'] = None`` until the CLI
invalidates the import caches, which a real install needs it to do); pip then runs for real
on the extra's requirements, and Flower's simulation engine runs the example app.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from airgossip.cli.baseline import LOCK, extra_requirements, following_total, lock_pins
from airgossip.cli.display import ProgressDisplay
from airgossip.emulation.fleets import FleetProgress
from tests.support.cli import ROOT

EXAMPLE = str(ROOT / "examples" / "flower-digits")

#: Runs the CLI with Ray hidden until ``importlib.invalidate_caches()``.
WITHOUT_RAY = """\
import sys

class ShowRayAgainOnInvalidate:
    def find_spec(self, name, path=None, target=None):
        return None

    def invalidate_caches(self):
        if sys.modules.get("ray", 0) is None:
            del sys.modules["ray"]
            print("test: ray visible again", file=sys.stderr)

sys.modules["ray"] = None
sys.meta_path.append(ShowRayAgainOnInvalidate())
from airgossip.cli import app
app(prog_name="airgossip", args=sys.argv[1:])
"""


def test_the_extra_is_the_one_pyproject_declares() -> None:
    declared = (ROOT / "pyproject.toml").read_text().split("\nbaseline = ", 1)[1]
    assert json.loads(declared.split("\n", 1)[0]) == extra_requirements() != []


def test_an_extra_installed_on_first_use_takes_the_lock_s_versions(tmp_path: Path) -> None:
    assert LOCK == ROOT / "requirements" / "dev.lock"
    constraints = tmp_path / "constraints.txt"
    assert lock_pins(LOCK, constraints) == ["-c", str(constraints)]
    pins = constraints.read_text().split()
    locked = re.findall(r"^(ray|flwr)==(\S+) ", LOCK.read_text(), re.M)
    assert len(locked) == 2 and all(f"{name}=={version}" in pins for name, version in locked)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==\S+", pin) for pin in pins)  # no hashes
    # Installed elsewhere than a checkout (no lock beside it): pip resolves as usual.
    assert lock_pins(tmp_path / "no.lock", constraints) == []


def test_the_bar_takes_the_run_s_total_from_its_progress() -> None:
    with ProgressDisplay(0, gossip_only=False) as display:
        update = following_total(display)
        update(FleetProgress(agents=2, rounds_total=20))
        update(FleetProgress(agents=2, rounds_total=20, registered=2, slowest_round=3))
        task = display.progress.tasks[0]
    assert (task.total, task.completed) == (20, 3)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_first_use_installs_the_extra_then_runs_with_the_real_total(tmp_path: Path) -> None:
    out = tmp_path / "fedavg"
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, "baseline", "flower", EXAMPLE, "--agents", "2",
         "--rounds", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=380, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    notice = [line for line in result.stderr.splitlines() if line.startswith("baseline:")]
    assert len(notice) == 1 and "installing Flower's simulation engine" in notice[0], result.stderr
    assert "flwr[simulation]>=1.42" in notice[0]
    assert "test: ray visible again" in result.stderr  # the CLI looked again after pip
    # Not a terminal: a progress line every few seconds, each with the real total.
    progress = [line for line in result.stdout.splitlines() if ": round " in line]
    assert progress and all("/2 " in line for line in progress), result.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["rounds"] == 2 and results["final"]["round"] == 2
