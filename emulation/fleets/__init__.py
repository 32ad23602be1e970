"""Fleets: one module per way of running agents (see :mod:`.base` for the contract).

``process`` (OS processes, real gRPC), ``inproc`` (lock step in this process), ``virtual``
(discrete events on a virtual clock), ``namespaces`` (network namespaces, links shaped by
the kernel), ``containers`` (Docker containers, each agent shaping its own links in the
kernel) and ``ray`` (Ray actors across a Ray cluster: :mod:`.ray_fleet`, :mod:`.ray_cluster`),
registered by mode in :mod:`.registry` (one line each, imported when looked up);
:mod:`.agent_fleet` is the base of the process-based fleets and :mod:`.processes` their group
of agent processes; :mod:`.run` checks a run and carries it to ``results.json`` (written by
:mod:`airgossip.node`).

The names below are loaded on first use (PEP 562): the registry, read by help texts and early
checks, imports no fleet (and no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airgossip.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from airgossip.emulation.fleets.base import (
        Fleet,
        FleetError,
        FleetProgress,
        Launch,
        ProgressCallback,
    )
    from airgossip.emulation.fleets.registry import FLEETS, fleet_class, modes_help
    from airgossip.emulation.fleets.run import Plan, preflight, run_fleet
    from airgossip.node.results_writer import reference_answer

#: Each public name and the module that defines it.
_HOMES = {
    **dict.fromkeys(["Fleet", "FleetError", "FleetProgress", "Launch", "ProgressCallback"],
                    "airgossip.emulation.fleets.base"),
    **dict.fromkeys(["FLEETS", "fleet_class", "modes_help"], "airgossip.emulation.fleets.registry"),
    **dict.fromkeys(["Plan", "preflight", "run_fleet"], "airgossip.emulation.fleets.run"),
    "reference_answer": "airgossip.node.results_writer",
}  # fmt: skip

__getattr__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "FLEETS",
    "Fleet",
    "FleetError",
    "FleetProgress",
    "Launch",
    "Plan",
    "ProgressCallback",
    "fleet_class",
    "modes_help",
    "preflight",
    "reference_answer",
    "run_fleet",
]
