"""The command line as users run it (a subprocess) and in this process (fast)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def airgossip(
    *args: str, timeout: float = 240, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI as users do (``python -m airgossip``) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "airgossip", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def cli(*args: str) -> Any:
    """The CLI in this process (fast); subprocess runs cover the real entry point."""
    from typer.testing import CliRunner

    from airgossip.cli import app

    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    result.returncode = result.exit_code
    return result


def assert_one_line_error(result: Any, *fragments: str) -> None:
    """A bad input was refused with exit code 2 and one line naming what was wrong."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def assert_tcp_carried_every_message(out: Path, results: dict[str, Any]) -> None:
    """On kernel-shaped links (namespaces, containers) no agent dropped a message itself
    (TCP resent the kernel's dropped packets), read from each agent's final record in
    ``out``. A push may still fail in transport, rarely (its last segment resent past the
    receiver's exit at the end of the run, say): one, or at most 1% of those sent, and
    counted in ``results`` as lost."""
    from airgossip.edge.observability.stats import read_records

    agents = out / "agents"
    finals = [read_records(agents, path.stem)[-1] for path in sorted(agents.glob("*.jsonl"))]
    assert finals and all(record.final for record in finals)
    assert sum(record.counters.messages_dropped for record in finals) == 0
    failed = sum(record.counters.messages_failed for record in finals)
    sent = sum(record.counters.messages_sent for record in finals)
    warnings = [
        line for path in sorted((out / "logs").glob("*.log"))
        for line in path.read_text().splitlines() if " WARNING " in line
    ]  # fmt: skip
    assert failed <= max(1, 0.01 * sent), (
        f"{failed} of {sent} pushes failed in transport; the agents warned:\n"
        + "\n".join(warnings[-20:])
    )
    assert results["final"]["messages_dropped"] == failed
