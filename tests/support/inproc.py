"""A scenario's settings run by the project's own lock-step fleet (``inproc``)."""

from __future__ import annotations

from typing import Any

from airgossip.emulation.fleets import preflight
from airgossip.emulation.fleets.inproc import InProcessFleet
from airgossip.scenario.config import load_config


def inproc_fleet(**settings: Any) -> InProcessFleet:
    """Run ``settings`` (a scenario's keys: agents, topology, task, network, switching...) in
    ``inproc`` mode, the lock-step fleet every in-process run uses, and return it finished:
    its records (``fleet.records()``, for :func:`airgossip.scenario.results.summarise`) and its
    agents (algorithms, tasks, assignments) for checks that need more than the records.

    ``[network]`` defaults as in a scenario (10% loss): give ``network={"loss": 0.0}`` for
    lossless links. The fleet takes the per-agent path even where a batched run would do
    (``batched=False``): its agents are what a check reads.
    """
    config = load_config(None, {"mode": "inproc", **settings})
    fleet = InProcessFleet(config, preflight(config).network, batched=False)
    fleet.run()
    return fleet
