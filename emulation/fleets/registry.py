"""Fleets by mode: adding a mode is one module and one line here."""

from __future__ import annotations

from airgossip.emulation.fleets.base import Fleet
from airgossip.emulation.fleets.containers import ContainerFleet
from airgossip.emulation.fleets.inproc import InProcessFleet
from airgossip.emulation.fleets.namespaces import NamespaceFleet
from airgossip.emulation.fleets.process import ProcessFleet
from airgossip.emulation.fleets.ray_fleet import RayFleet
from airgossip.emulation.fleets.virtual import VirtualFleet
from airgossip.scenario.config import ConfigError

#: Every fleet mode, by the name ``--mode`` takes, in the order help texts list them.
FLEETS: dict[str, type[Fleet]] = {
    cls.mode: cls
    for cls in (
        ProcessFleet,
        InProcessFleet,
        VirtualFleet,
        NamespaceFleet,
        ContainerFleet,
        RayFleet,
    )
}


def fleet_class(mode: str) -> type[Fleet]:
    """The fleet of ``mode``; :class:`ConfigError` naming the modes there are."""
    if mode not in FLEETS:
        raise ConfigError(f"unknown mode '{mode}'; choose one of: {', '.join(FLEETS)}")
    return FLEETS[mode]


def modes_help() -> str:
    """Every mode with its one-line summary, for help texts."""
    return "; ".join(f"{mode}: {cls.summary}" for mode, cls in FLEETS.items())
