"""The run a fleet is: its id, the scenario every agent runs, and the round records agents report.

A fleet of agents started by hand on separate devices is one run, as ``airgossip run``'s is:
the coordinator names it (:func:`new_run_id`), hands every agent the scenario at
registration (one source of truth: an agent whose own settings disagree is refused, and the
refusal names the settings, see :func:`disagreements`), and keeps every agent's round
records as the agents report them (:class:`RunLog`), from which results are written when
the last agent has finished.

The coordinator does not interpret the scenario: it is plain JSON to hand out and compare.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge.observability.stats import RoundRecord

#: The reason a finished agent gives when it leaves (``LeaveRequest.reason``).
REASON_FINISHED = "finished"
#: Settings each agent may choose for itself (where it computes, writes, how it is started);
#: every other setting is the fleet's.
PER_AGENT_SETTINGS = frozenset({"device", "out", "mode"})
#: Longest estimate (elements) a round report may carry: a larger model is reported as a
#: count sketch of this many buckets (:func:`edge.observability.stats.probe_estimate`).
#: The coordinator keeps every report for the results: at most 32 KB per agent and round.
REPORT_ESTIMATE_LIMIT = 1 << 12
#: Largest request the coordinator reads (larger ones are refused by gRPC before they are
#: parsed): a heartbeat of 1,024 links is about 60 KB.
MAX_REQUEST_BYTES = 1 << 20
#: Longest settings an agent may declare (JSON characters): well inside one request.
MAX_DECLARED_CHARS = 1 << 18
#: Most round reports one ``Report`` call may carry.
MAX_REPORTS_PER_CALL = 256
#: Estimate bytes after which an agent closes a batch of round reports: with the largest
#: single report (32 KB) on top it stays well inside :data:`MAX_REQUEST_BYTES`.
REPORT_BATCH_BYTES = MAX_REQUEST_BYTES // 2


def new_run_id(now: float | None = None) -> str:
    """A run id: the start time and four random hex digits (``20261201-081730-3f2a``)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class RunSpec:
    """What the coordinator hands every agent of the run.

    Attributes
    ----------
    run_id:
        Names the run in logs, ``/fleet`` and the results.
    scenario:
        The settings every agent runs, as JSON (empty: agents bring their own).
    rounds:
        Rounds per agent (0: not known to the coordinator).
    """

    run_id: str = field(default_factory=new_run_id)
    scenario: Mapping[str, Any] = field(default_factory=dict)
    rounds: int = 0


def _same(declared: Any, fleet: Any) -> bool:
    if isinstance(declared, bool) or isinstance(fleet, bool):
        return declared is fleet
    if isinstance(declared, int | float) and isinstance(fleet, int | float):
        return math.isclose(declared, fleet, rel_tol=1e-12, abs_tol=0.0)
    if isinstance(declared, list | tuple) and isinstance(fleet, list | tuple):
        return len(declared) == len(fleet) and all(
            _same(d, f) for d, f in zip(declared, fleet, strict=True)
        )
    if isinstance(declared, Mapping) and isinstance(fleet, Mapping):
        return not disagreements(fleet, declared, prefix="(nested).")
    return bool(declared == fleet)


def _show(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a table" if value else "an empty table"
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


def disagreements(
    fleet: Mapping[str, Any], declared: Mapping[str, Any], *, prefix: str = ""
) -> list[str]:
    """The settings ``declared`` (what an agent was started with) sets otherwise than
    ``fleet`` (the run's scenario), each as ``name = here, fleet``; settings an agent may
    choose for itself (:data:`PER_AGENT_SETTINGS`) are left aside."""
    out: list[str] = []
    for key, value in declared.items():
        name = f"{prefix}{key}"
        if not prefix and key in PER_AGENT_SETTINGS:
            continue
        if key not in fleet:
            out.append(f"{name} = {_show(value)} here, not set in the fleet")
        elif isinstance(value, Mapping) and isinstance(fleet[key], Mapping):
            out += disagreements(fleet[key], value, prefix=f"{name}.")
        elif not _same(value, fleet[key]):
            out.append(f"{name} = {_show(value)} here, {_show(fleet[key])} in the fleet")
    return out


def check_estimate(estimate: np.ndarray) -> None:
    """``ValueError`` for a reported estimate that is too long or not finite."""
    if estimate.size > REPORT_ESTIMATE_LIMIT:
        raise ValueError(
            f"estimate of {estimate.size} elements; round reports carry at most "
            f"{REPORT_ESTIMATE_LIMIT} (a sketch of larger ones)"
        )
    if not np.all(np.isfinite(estimate)):
        raise ValueError("estimate holds NaN or infinity")


class RunLog:
    """Every agent's round records of one run, by agent and round; thread-safe.

    A record reported twice (a retried report) replaces the first; an agent that restarted
    reports its rounds again, and its latest report of each round is kept.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, dict[int, RoundRecord]] = {}

    def add(self, agent_id: str, records: Iterable[RoundRecord]) -> int:
        """Keep ``records`` of ``agent_id``; return how many rounds it has reported."""
        with self._lock:
            held = self._records.setdefault(agent_id, {})
            for record in records:
                held[record.round] = record
            return len(held)

    def records(self) -> dict[str, list[RoundRecord]]:
        """Every agent's records in round order."""
        with self._lock:
            return {a: [rs[r] for r in sorted(rs)] for a, rs in self._records.items()}

    def at_round(self, round_index: int) -> dict[str, RoundRecord]:
        """Every agent's record of ``round_index``, by agent (agents that did not report it
        are missing)."""
        with self._lock:
            return {a: rs[round_index] for a, rs in self._records.items() if round_index in rs}

    def fleet_round(self) -> int:
        """The round the run's agents have reached: the median of the latest round each
        reported (0 before any report), so that one agent cannot move it far."""
        with self._lock:
            latest = sorted(max(rs) for rs in self._records.values() if rs)
        return latest[len(latest) // 2] if latest else 0

    def latest_round(self, agent_id: str) -> int | None:
        with self._lock:
            held = self._records.get(agent_id)
            return max(held) if held else None
