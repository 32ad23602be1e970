"""The kernel link applier: links shaped by tc and iptables, on one interface per agent.

:class:`InterfaceLinks` shapes one agent's links on its own interface, where the kernel can:

* rate: an HTB class per destination on the interface's egress (a short pfifo under it, so
  that queueing does not add seconds of delay);
* loss: an ``iptables ... -m statistic --mode random --probability p -j DROP`` rule per
  source in the ``INPUT`` chain (dropping at the receiver, so the sender's own TCP does not
  see a local drop), preceded by a counting rule: the counters measure the packets that
  arrived and those dropped;
* latency and jitter: ``netem`` under the class when the kernel has it.

Two backends use it. :class:`NamespaceNetwork` makes one Linux network namespace per agent, with one
veth into a hub namespace that bridges them all (addresses ``10.213.0.0/24``, private to the
namespaces it creates), and :class:`LinkController` applies any network's
:class:`~airgossip.node.network.KernelLinks` to all of them from outside, step by step.
In a container, the agent applies its own share (:class:`AgentKernelLinks`: the rate and latency of
its out-links, the loss of its in-links) inside its own network namespace, following its peers'
addresses as the coordinator hands them out; that needs ``NET_ADMIN``.

What the kernel cannot apply is listed in :attr:`InterfaceLinks.unapplied` (latency and
jitter without netem, say), beside what the network itself says it models beyond a kernel
(:attr:`~airgossip.node.network.KernelLinks.unapplied`).

The package by role: :mod:`.tools` (probing the kernel, running its tools),
:mod:`.interface` (one interface's links and counters), :mod:`.namespaces` (the namespace
network and its controller), :mod:`.agent` (an agent's own links) and :mod:`.reports`
(``kernel.json``).
"""

from airgossip.emulation.networks.kernel.agent import AgentKernelLinks
from airgossip.emulation.networks.kernel.interface import InterfaceLinks, LinkMeasure
from airgossip.emulation.networks.kernel.namespaces import (
    AGENT_PORT,
    LinkController,
    NamespaceNetwork,
)
from airgossip.emulation.networks.kernel.reports import (
    AgentKernelReport,
    ContainerKernelReport,
    LinkSummary,
    NamespaceKernelReport,
)
from airgossip.emulation.networks.kernel.tools import (
    KernelSupport,
    KernelUnavailable,
    kernel_support,
)

__all__ = [
    "AGENT_PORT",
    "AgentKernelLinks",
    "AgentKernelReport",
    "ContainerKernelReport",
    "InterfaceLinks",
    "KernelSupport",
    "KernelUnavailable",
    "LinkController",
    "LinkMeasure",
    "LinkSummary",
    "NamespaceKernelReport",
    "NamespaceNetwork",
    "kernel_support",
]
