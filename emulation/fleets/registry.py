"""Fleets by mode: adding a mode is one module and one line here.

Each line names the mode (the class declares the same ``mode``), where its class lives and
what it is in one line, for help texts; the class is imported when the mode is looked up, so
listing the modes imports no fleet and no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airgossip.common.plugins import PluginRegistry
from airgossip.scenario.errors import ConfigError

if TYPE_CHECKING:
    from airgossip.emulation.fleets.base import Fleet

_HERE = "airgossip.emulation.fleets"

#: Every fleet mode, by the name ``--mode`` takes, in the order help texts list them.
FLEETS: PluginRegistry[type[Fleet]] = PluginRegistry(
    "mode",
    {
        "process": (f"{_HERE}.process:ProcessFleet",
                    "one OS process per agent, real gRPC, an embedded coordinator"),
        "inproc": (f"{_HERE}.inproc:InProcessFleet",
                   "all agents in this process in lock step, deterministic"),
        "virtual": (f"{_HERE}.virtual:VirtualFleet",
                    "all agents in this process as discrete events on a virtual clock"),
        "namespaces": (f"{_HERE}.namespaces:NamespaceFleet",
                       "one network namespace per agent (root), links shaped by the kernel "
                       "(tc, iptables)"),
        "containers": (f"{_HERE}.containers:ContainerFleet",
                       "one Docker container per agent, each shaping its own links in the "
                       "kernel (NET_ADMIN)"),
        "ray": (f"{_HERE}.ray_fleet:RayFleet",
                "agents forked by host actors across a Ray cluster, real gRPC (the ray extra)"),
    },
    declares="mode",
)  # fmt: skip


def fleet_class(mode: str) -> type[Fleet]:
    """The fleet of ``mode``; :class:`ConfigError` naming the modes there are."""
    if mode not in FLEETS:
        raise ConfigError(FLEETS.unknown(mode))
    return FLEETS[mode]


def modes_help() -> str:
    """Every mode with its one-line summary, for help texts."""
    return "; ".join(f"{mode}: {FLEETS.summary(mode)}" for mode in FLEETS)
