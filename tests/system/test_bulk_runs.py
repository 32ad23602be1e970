"""``[transport] bulk_bytes``: a fleet of agent processes moves its payloads over the bulk
path (a data connection per push, mutual TLS on the agents' certificates) and push-sum stays
exact under loss; bad values are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import airgossip, assert_one_line_error, cli

SCENARIO = """\
agents = 16
rounds = 200
wait_timeout_s = 0.5

[task]
name = "consensus"
dim = 1000

[network]
loss = 0.3

[transport]
bulk_bytes = 1
"""


@pytest.mark.slow  # about 35 s on 2 cores
@pytest.mark.timeout(400)
def test_sixteen_processes_at_30_percent_loss_stay_exact_over_the_bulk_path(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "bulk.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "run"
    result = airgossip("run", "--config", str(scenario), "--out", str(out), timeout=360)
    assert result.returncode == 0, result.stdout + result.stderr
    final = json.loads((out / "results.json").read_text())["final"]
    assert final["complete"] and final["round"] == 200
    assert final["relative_error"] < 1e-6
    assert final["messages_dropped"] > 0.2 * final["messages_sent"]  # the 30% loss happened
    # Every agent received its pushes over data connections, not only offered them.
    logs = sorted((out / "logs").glob("agent-*.log"))
    assert len(logs) == 16
    for log in logs:
        assert "pushes arrive over the bulk path" in log.read_text(), log.name


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("-1", "greater than or equal to 0"), ('"big"', "valid integer")],
)
def test_a_bad_bulk_size_is_refused_in_one_line(tmp_path: Path, value: str, fragment: str) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text(f"[transport]\nbulk_bytes = {value}\n")
    result = cli("run", "--config", str(scenario), "--out", str(tmp_path / "run"))
    assert_one_line_error(result, "transport.bulk_bytes", fragment)
