"""The run a fleet is: its id, the scenario every agent runs, and the round records agents report.

A fleet of agents started by hand on separate devices is one run, as ``airgossip run``'s is:
the coordinator names it (:func:`new_run_id`), hands every agent the scenario at
registration (one source of truth: an agent whose own settings disagree is refused, and the
refusal names the settings, see :func:`disagreements`), and keeps every agent's round
records as the agents report them (:mod:`airgossip.coordinator.rounds`, checked against the run by
:mod:`airgossip.coordinator.reports`), from which results are written when the last agent has
finished.

The coordinator does not interpret the scenario: it is plain JSON to hand out and compare.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np

#: A JSON value as :func:`json.loads` returns it.
JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
#: A JSON object (a scenario's settings, say).
JsonObject: TypeAlias = "dict[str, JsonValue]"

#: The reason a finished agent gives when it leaves (``LeaveRequest.reason``).
REASON_FINISHED = "finished"
#: Settings each agent may choose for itself (where it computes, writes, how it is started);
#: every other setting is the fleet's.
PER_AGENT_SETTINGS = frozenset({"device", "out", "mode"})
#: Longest estimate (elements) a round report may carry: a larger model is reported as a
#: count sketch of this many buckets (:func:`airgossip.edge.observability.stats.probe_estimate`).
#: The coordinator keeps every report for the results: at most 32 KB per agent and round.
REPORT_ESTIMATE_LIMIT = 1 << 12
#: Largest request the coordinator reads (larger ones are refused by gRPC before they are
#: parsed): a heartbeat of 1,024 links is about 60 KB.
MAX_REQUEST_BYTES = 1 << 20
#: Longest settings an agent may declare (JSON characters): well inside one request.
MAX_DECLARED_CHARS = 1 << 18
#: Most round reports one ``Report`` call may carry.
MAX_REPORTS_PER_CALL = 256
#: The last round of a run whose length the coordinator does not know: the most rounds an
#: agent runs (``AgentSettings.rounds``).
MAX_ROUNDS = 10_000_000
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
    scenario: Mapping[str, JsonValue] = field(default_factory=dict)
    rounds: int = 0

    @property
    def last_round(self) -> int:
        """The last round an agent of the run may report."""
        return self.rounds if self.rounds > 0 else MAX_ROUNDS


def _same(declared: JsonValue, fleet: JsonValue) -> bool:
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


def _show(value: JsonValue) -> str:
    if isinstance(value, Mapping):
        return "a table" if value else "an empty table"
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


def disagreements(
    fleet: Mapping[str, JsonValue], declared: Mapping[str, JsonValue], *, prefix: str = ""
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
            continue
        theirs = fleet[key]
        if isinstance(value, Mapping) and isinstance(theirs, Mapping):
            out += disagreements(theirs, value, prefix=f"{name}.")
        elif not _same(value, theirs):
            out.append(f"{name} = {_show(value)} here, {_show(theirs)} in the fleet")
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


def report_length(numel: int) -> int:
    """Elements of the estimate a round report carries for a model of ``numel`` elements:
    the estimate itself up to :data:`REPORT_ESTIMATE_LIMIT`, a sketch of that size beyond."""
    return min(int(numel), REPORT_ESTIMATE_LIMIT)
