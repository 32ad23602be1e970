"""``namespaces`` mode: one agent process per Linux network namespace, static peers, every
directed link shaped by the kernel (tc, iptables) from the network's
:class:`~airgossip.node.network.KernelLinks`, step by step."""

from __future__ import annotations

import time
from pathlib import Path

from airgossip.common.identity import agent_ids
from airgossip.common.security.private_files import write_private
from airgossip.emulation.fleets.agent_fleet import AgentProcessFleet
from airgossip.emulation.fleets.base import Launch, refuse_round_driven
from airgossip.emulation.networks import Network
from airgossip.emulation.networks.kernel import (
    AGENT_PORT,
    KernelUnavailable,
    LinkController,
    NamespaceKernelReport,
    NamespaceNetwork,
    kernel_support,
)
from airgossip.node.command import AgentCommand
from airgossip.scenario.config import ConfigError, RunConfig


class NamespaceFleet(AgentProcessFleet):
    """Agents in network namespaces on one bridge, links applied by the kernel."""

    mode = "namespaces"
    links_in_kernel = True
    # Every agent is wrapped in `ip netns exec`: a process of its own, no fork server.
    fork_server = False

    def __init__(self, config: RunConfig, network: Network, launch: Launch) -> None:
        super().__init__(config, network, launch)
        self.namespaces: NamespaceNetwork | None = None
        self.controller: LinkController | None = None
        self.unapplied: list[str] = []
        #: What the kernel applied and measured (also written to ``kernel.json``).
        self.report: NamespaceKernelReport | None = None

    @classmethod
    def refuse(cls, config: RunConfig, network: Network) -> str | None:
        if not 1 <= config.agents <= 250:
            return f"mode 'namespaces' runs 1 to 250 agents, not {config.agents}"
        if network.round_driven:
            return refuse_round_driven(cls.mode, network)
        support = kernel_support()
        return None if support.available else f"mode 'namespaces': {support.reason}"

    def start_agents(self) -> None:
        ids = agent_ids(self.config.agents)
        try:
            namespaces = self.namespaces = NamespaceNetwork(self.config.agents)
        except KernelUnavailable as err:
            raise ConfigError(f"mode 'namespaces': {err}") from None
        links = self.network.kernel_links()
        peers = self.folder.path / "peers.toml"
        write_peers(peers, {a: f"{addr}:{AGENT_PORT}" for a, addr in
                            zip(ids, namespaces.addresses, strict=True)})  # fmt: skip
        self.unapplied = [*links.unapplied, *namespaces.unapplied]
        if self.unapplied:
            self.launch.notice("the kernel does not apply: " + "; ".join(self.unapplied))
        namespaces.create()
        self.controller = LinkController(namespaces, links, time.time() - self.clock_s())
        self.controller.start()
        for index, agent_id in enumerate(ids):
            listen = f"{namespaces.addresses[index]}:{AGENT_PORT}"
            # The kernel shapes the links: the agents do not shape them again.
            own = AgentCommand(listen=listen, peers=peers, link_shaping=False)
            self.agents.spawn(index, agent_id, own, prefix=namespaces.exec_prefix(index))

    def close(self) -> None:
        if self.namespaces is None:
            return
        try:
            if self.controller is not None:
                self.controller.close()
                self.namespaces.sample()
                self.report = NamespaceKernelReport(
                    netem=self.namespaces.netem,
                    unapplied=self.unapplied,
                    controller_errors=self.controller.errors[:5],
                    links=[
                        m.summary() for m in self.namespaces.measures(agent_ids(self.config.agents))
                    ],
                )
                self.report.write(self.folder.path / "kernel.json")
        finally:
            self.namespaces.destroy()


def write_peers(path: Path, peers: dict[str, str]) -> None:
    """Write a static peer list (``[peers]`` of id = "host:port") for ``--peers``."""
    write_private(path, "[peers]\n" + "".join(f'"{a}" = "{addr}"\n' for a, addr in peers.items()))
