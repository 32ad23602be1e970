"""The benchmark runner's own measures: a process tree's CPU and memory, and the time a fleet
first reached the target accuracy (the benchmarks themselves are not part of the suite)."""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.comparison import AGENTS, time_to_target, verdict_of
from benchmarks.proctree import run_watched


def test_time_to_target_waits_for_every_peer_of_the_first_round_that_reaches_it() -> None:
    launched = 100.0
    rows = [(str(a), 1, 0.5, 101.0 + a) for a in range(AGENTS)]
    # Round 2: mean 0.95 but one peer late; round 3 below the target again.
    rows += [(str(a), 2, 0.95, 102.0 + (5.0 if a == 3 else 0.0)) for a in range(AGENTS)]
    rows += [(str(a), 3, 0.85, 110.0) for a in range(AGENTS)]
    round_hit, seconds, best = time_to_target(rows, launched)
    assert round_hit == 2
    assert seconds == 7.0
    assert abs(best - 0.95) < 1e-12


def test_a_round_missing_a_peer_does_not_count() -> None:
    rows = [(str(a), 1, 0.99, 1.0) for a in range(AGENTS - 1)]
    assert time_to_target(rows, 0.0) == (None, None, 0.0)


def test_a_comparison_against_a_contender_that_did_not_run_is_not_measured() -> None:
    """The peers' verdict: a failed check fails it, whatever did not run; a check that could
    not be made (p2pfl gone past its time, --quick without frameworks) leaves it not
    measured, never met."""
    assert verdict_of(True, True, True, True) is True
    assert verdict_of(True, True, True, None) is None
    assert verdict_of(None, None, True, None) is None
    assert verdict_of(True, False, True, None) is False
    assert verdict_of(None, None, False, None) is False


def test_the_tree_watch_counts_a_grandchild_s_cpu_and_memory(tmp_path: Path) -> None:
    # A child that starts a grandchild burning CPU and holding 64 MiB, and waits for it.
    burn = (
        "import time; b = bytearray(64 << 20); t = time.process_time()\n"
        "while time.process_time() - t < 1.0: pass"
    )
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"
    cost = run_watched(
        [sys.executable, "-c", parent], log_path=tmp_path / "log", isolate_network=False
    )
    assert cost.returncode == 0
    assert cost.cpu_s >= 0.9
    assert cost.peak_pss_bytes >= 64 << 20
    assert cost.processes >= 2
