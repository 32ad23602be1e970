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
