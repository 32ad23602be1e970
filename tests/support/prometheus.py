"""Prometheus's own tools on what the project exposes."""

from __future__ import annotations

import shutil
import subprocess


def promtool_check(text: str) -> None:
    """`promtool check metrics` must accept the exposition without a single lint remark."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `./scripts/install --dev` installs Debian's prometheus"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )
