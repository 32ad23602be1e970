"""The benchmark runner's own measures: a process tree's CPU and memory, and the time a fleet
first reached the target accuracy (the benchmarks themselves are not part of the suite)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from benchmarks.comparison import AGENTS, STALL_S, Stamper, time_to_target, verdict_of
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


def test_a_stalled_command_is_stopped_with_what_it_cost_until_then(tmp_path: Path) -> None:
    """A contender that stops recording (p2pfl's nodes after declaring each other dead) is
    stopped when ``stalled`` says so, not left to its timeout, and what it cost so far is
    kept with the reason."""
    began = time.perf_counter()
    cost = run_watched(
        [sys.executable, "-c", "import time; b = bytearray(32 << 20); time.sleep(120)"],
        log_path=tmp_path / "log", isolate_network=False, timeout_s=100,
        stalled=lambda: "stuck" if time.perf_counter() - began > 1.5 else None,
    )  # fmt: skip
    assert cost.stopped == "stuck" and cost.returncode == -9
    assert cost.wall_s < 30
    assert cost.peak_pss_bytes > 32 << 20


def test_a_contender_is_stalled_only_once_it_recorded_and_then_went_quiet(tmp_path: Path) -> None:
    stamps = Stamper(tmp_path, "*.jsonl")
    assert stamps.stalled() is None  # nothing recorded yet: start-up is the timeout's
    now = time.time()
    stamps.seen += [(now - STALL_S - 10.0, {"round": 1}), (now - STALL_S - 5.0, {"round": 2})]
    reason = stamps.stalled()
    assert reason is not None and "no new record" in reason, reason
    stamps.seen.append((now - 1.0, {"round": 3}))  # recording again
    assert stamps.stalled() is None
