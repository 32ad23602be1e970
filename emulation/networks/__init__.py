"""Networks and link shaping: what the links between agents are (see :mod:`.base`).

One module per kind of link (``static``, ``wireless``) and one registry line each; the
shaper, gossip graph and records of the wireless network, the kernel link applier of
namespaces and containers, and the link table of ``airgossip links`` live beside them.
"""

from airgossip.emulation.networks.static import StaticNetwork
from airgossip.emulation.networks.wireless import WirelessNetwork
from airgossip.node.network import (
    Clock,
    KernelLinks,
    KernelLinkState,
    LinkRuntime,
    Network,
)
from airgossip.scenario.config import RunConfig

#: Networks by kind (:attr:`RunConfig.network_kind`).
NETWORKS: dict[str, type[Network]] = {cls.kind: cls for cls in (StaticNetwork, WirelessNetwork)}


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
