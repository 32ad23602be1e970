"""Fleets by mode: adding a mode is one module and one line here."""

from __future__ import annotations

from emulation.config import ConfigError
from emulation.fleets.base import Fleet
from emulation.fleets.containers import ContainerFleet
from emulation.fleets.inproc import InProcessFleet
from emulation.fleets.namespaces import NamespaceFleet
from emulation.fleets.process import ProcessFleet
from emulation.fleets.ray_fleet import RayFleet
from emulation.fleets.virtual import VirtualFleet

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
