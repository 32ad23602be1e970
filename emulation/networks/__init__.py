"""Networks and link shaping: what the links between agents are (see :mod:`.base`).

One module per kind of link (``static``, ``wireless``) and one registry line each; the
shaper, gossip graph and records of the wireless network, the kernel link applier of
namespaces and containers, and the link table of ``airgossip links`` live beside them. A
network's module is imported when a run asks for its kind: a static run never imports the
wireless channel model (SciPy), which the command line would otherwise load before its
agents start.
"""

from typing import TYPE_CHECKING

from airgossip.common.lazy_exports import lazy_exports
from airgossip.common.plugins import PluginRegistry
from airgossip.node.network import (
    Clock,
    KernelLinks,
    KernelLinkState,
    LinkRuntime,
    Network,
)
from airgossip.scenario.config import RunConfig

if TYPE_CHECKING:
    from airgossip.emulation.networks.static import StaticNetwork
    from airgossip.emulation.networks.wireless import WirelessNetwork

#: Networks by kind (:attr:`RunConfig.network_kind`).
NETWORKS: PluginRegistry[type[Network]] = PluginRegistry(
    "network",
    {
        "static": "airgossip.emulation.networks.static:StaticNetwork",
        "wireless": "airgossip.emulation.networks.wireless:WirelessNetwork",
    },
    declares="kind",
)

__getattr__ = lazy_exports(
    __name__,
    {
        "StaticNetwork": "airgossip.emulation.networks.static",
        "WirelessNetwork": "airgossip.emulation.networks.wireless",
    },
)


def network_for(config: RunConfig) -> Network:
    """The network a run config describes."""
    return NETWORKS[config.network_kind](config)


__all__ = [
    "NETWORKS",
    "Clock",
    "KernelLinkState",
    "KernelLinks",
    "LinkRuntime",
    "Network",
    "StaticNetwork",
    "WirelessNetwork",
    "network_for",
]
