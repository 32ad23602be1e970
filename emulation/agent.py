"""``python -m airgossip.emulation.agent``: one agent process as the fleets start it, its links
emulated as its scenario says (in the agent, or in the kernel with ``--kernel-links``).

The node runtime (:mod:`airgossip.node`) runs the agent; this is where the emulation layer
hands it the run's network (:func:`~airgossip.emulation.networks.network_for`) and the kernel
link applier (:func:`~airgossip.emulation.networks.kernel.agent.agent_kernel_links`).
"""

from __future__ import annotations

import sys

from airgossip.emulation.networks import network_for
from airgossip.emulation.networks.kernel.agent import agent_kernel_links
from airgossip.node import agent
from airgossip.node.links import Links

#: The links of an agent process whose network (and device class) is emulated.
EMULATED_LINKS = Links(
    network_for=network_for, kernel_links=agent_kernel_links, emulates_devices=True
)


def main(argv: list[str] | None = None) -> int:
    """Run the agent of ``argv`` (default: this process's arguments); its exit code."""
    return agent.main(EMULATED_LINKS, argv, prog="python -m airgossip.emulation.agent")


if __name__ == "__main__":
    sys.exit(main())
