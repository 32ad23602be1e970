"""Uneven fleets of real agent processes over real gRPC (``airgossip run``, process mode):
asynchronous push-sum stays exact under loss; a slow device class really computes slower;
an agent whose battery is spent leaves, and the run ends without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import airgossip
from tests.support.processes import kill_all

pytestmark = pytest.mark.slow


def run(tmp_path: Path, *args: str, scenario: str = "") -> dict[str, object]:
    out = tmp_path / "run"
    config = tmp_path / "scenario.toml"
    config.write_text(scenario)
    try:
        result = airgossip("run", "--config", str(config), "--out", str(out), *args)
        assert result.returncode == 0, result.stderr + result.stdout
        results: dict[str, object] = json.loads((out / "results.json").read_text())
        results["out"] = str(out)
        results["stdout"] = result.stdout
        return results
    finally:
        kill_all(str(out))


def test_asynchronous_consensus_is_exact_at_30_percent_loss(tmp_path: Path) -> None:
    results = run(
        tmp_path, "--task", "consensus", "--agents", "6", "--loss", "0.3", "--rounds", "150",
        "--pace", "async",
    )  # fmt: skip
    final = results["final"]
    assert isinstance(final, dict)
    assert final["complete"] and final["agents_reporting"] == 6
    assert final["relative_error"] < 1e-9
    assert final["messages_dropped"] > 0.2 * final["messages_sent"]
    config = results["config"]
    assert isinstance(config, dict) and config["pace"] == "async"


SLOW_AND_SPENT = """
agents = 4
rounds = 12
topology = "complete"
[task]
name = "digits"
local_steps = 100
[network]
loss = 0.0
[[device_classes]]
name = "pi"
agents = [3]
speed = 0.25
compute_w = 2.0
[[device_classes]]
name = "tiny"
agents = [2]
compute_w = 5.0
battery_j = 0.1
[[device_classes]]
name = "phone"
agents = [0]
compute_w = 2.0
"""


def test_a_slow_class_computes_slower_and_a_spent_battery_leaves(tmp_path: Path) -> None:
    # In rounds, the agents compute side by side to the end: each one's steps meet the same
    # contention for this machine's cores (at its own pace the fast ones finish first, and the
    # slow one's later steps have the cores to itself).
    results = run(tmp_path, "--pace", "rounds", scenario=SLOW_AND_SPENT)
    final = results["final"]
    assert isinstance(final, dict)
    # agent-2 spent its battery and left; the three others finished every round
    assert final["agents_depleted"] == 1 and final["agents_reporting"] == 3
    assert final["round"] == 12 and final["mean_accuracy"] > 0.8
    assert "1 battery spent" in str(results["stdout"])
    out = Path(str(results["out"]))
    records = {
        i: [json.loads(line) for line in (out / "agents" / f"agent-{i}.jsonl").open()]
        for i in range(4)
    }
    spent = records[2][-1]
    assert spent["final"] and spent["round"] < 12 and spent["metrics"]["battery_left_j"] == 0
    assert "battery spent" in (out / "logs" / "agent-2.log").read_text()
    # its local steps stretched to four times its host's: it computed about four times as
    # long as agent-0 (at the host's speed, the same power) over the same rounds; a ratio
    # of compute times, not of rounds' wall times, whose share of messaging and evaluation
    # depends on the machine
    pi, phone = records[3][-1]["metrics"], records[0][-1]["metrics"]
    assert "energy_j" not in records[1][-1]["metrics"]  # the host class draws nothing
    assert pi["compute_j"] == pytest.approx(pi["energy_j"])  # no radio power
    log = (out / "logs" / "agent-3.log").read_text()
    assert "each local step stretched to 4 times the host's" in log
    assert records[3][-1]["round"] == records[0][-1]["round"] == 12
    assert pi["compute_j"] > 2.5 * phone["compute_j"]
