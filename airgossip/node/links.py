"""How an agent process comes by its links: handed in by whoever starts it.

The node runtime runs one agent whatever its links are; what they are is a
:class:`~airgossip.node.network.Network` (the graph its scenario describes, and the
emulated impairments on it), made by the emulation layer. The node never imports that
layer: its callers hand in a :class:`Links` (``python -m airgossip.emulation.agent``, which
the fleets start, and the CLI's ``airgossip agent``, whose links are as they are
(:class:`~airgossip.node.topology_network.TopologyNetwork`) unless its scenario emulates
some), as the agent is handed a transport and a link shaper.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from airgossip.node.network import Network
from airgossip.scenario.config import RunConfig

if TYPE_CHECKING:
    from airgossip.edge.observability.metrics import AgentMetrics
    from airgossip.node.options import AgentProcessOptions


class KernelReport(Protocol):
    """What a kernel shaping of an agent's links says when it ends."""

    def write(self, path: Path) -> None:
        """Write the report as JSON to ``path``."""


class KernelShaping(Protocol):
    """An agent's own links shaped by the kernel (tc and iptables on its interface)."""

    def follow(self, peers: Callable[[], dict[str, str]]) -> None:
        """Shape the links to the peers ``peers()`` names from now on, as they change."""

    def close(self) -> KernelReport:
        """Take the shaping off; what it did."""


#: ``(network, ids, options, metrics)``: this agent's links shaped by the kernel on
#: ``options.kernel_device``, or None where the kernel refuses (said in the log and in
#: ``<id>.kernel.json``).
KernelLinksFactory = Callable[
    [Network, list[str], "AgentProcessOptions", "AgentMetrics | None"], KernelShaping | None
]


@dataclass(frozen=True)
class Links:
    """Where an agent process's links come from.

    Attributes
    ----------
    network_for:
        The network a run config describes.
    kernel_links:
        Shapes the agent's links in the kernel (``--kernel-links``); None: this process
        cannot, and an agent asked to is refused with a line that says so.
    emulates_devices:
        The agent's ``[[device_classes]]`` class is emulated (its steps stretched to the
        class's speed): True for an emulated fleet's agents, False on a real device, which
        is what it is.
    """

    network_for: Callable[[RunConfig], Network]
    kernel_links: KernelLinksFactory | None = None
    emulates_devices: bool = False


def kernel_report_path(options: AgentProcessOptions) -> Path | None:
    """``<id>.kernel.json`` beside the agent's records (the container fleet gathers them)."""
    return options.stats_dir / f"{options.agent_id}.kernel.json" if options.stats_dir else None
