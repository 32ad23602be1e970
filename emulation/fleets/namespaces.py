"""``namespaces`` mode: one agent process per Linux network namespace, static peers, every
directed link shaped by the kernel (tc, iptables) from the network's
:class:`~emulation.networks.base.KernelLinks`, step by step."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, ClassVar

from edge.config.identity import agent_ids
from edge.observability.stats import RoundRecord
from emulation.config import ConfigError, RunConfig
from emulation.fleets.base import FleetProgress, Launch, ProgressKeeper, refuse_round_driven
from emulation.fleets.processes import AgentProcesses
from emulation.networks import LinkRuntime, Network
from emulation.networks.kernel import (
    AGENT_PORT,
    KernelUnavailable,
    LinkController,
    NamespaceNetwork,
    kernel_support,
)


class NamespaceFleet:
    """Agents in network namespaces on one bridge, links applied by the kernel."""

    mode: ClassVar[str] = "namespaces"
    summary: ClassVar[str] = (
        "one network namespace per agent (root), links shaped by the kernel (tc, iptables)"
    )
    in_process: ClassVar[bool] = False
    serves_metrics: ClassVar[bool] = False

    def __init__(self, config: RunConfig, network: Network, launch: Launch) -> None:
        self.config = config
        self.network = network
        self.launch = launch
        self.keeper = ProgressKeeper(config, launch.on_progress)
        # Every agent is wrapped in `ip netns exec`: a process of its own, no fork server.
        self.agents = AgentProcesses(
            config, launch.out_dir, launch.config_path, self.keeper, insecure=launch.insecure,
            fork_server=False,
        )  # fmt: skip
        self._clock = network.wall_clock()
        #: What the kernel applied and measured (also written to ``kernel.json``).
        self.report: dict[str, Any] = {}

    @classmethod
    def refuse(cls, config: RunConfig, network: Network) -> str | None:
        if not 1 <= config.agents <= 250:
            return f"mode 'namespaces' runs 1 to 250 agents, not {config.agents}"
        if network.round_driven:
            return refuse_round_driven(cls.mode, network)
        support = kernel_support()
        return None if support.available else f"mode 'namespaces': {support.reason}"

    def run(self) -> None:
        ids = agent_ids(self.config.agents)
        try:
            namespaces = NamespaceNetwork(self.config.agents)
        except KernelUnavailable as err:
            raise ConfigError(f"mode 'namespaces': {err}") from None
        links = self.network.kernel_links()
        peers = self.launch.out_dir / "peers.toml"
        write_peers(peers, {a: f"{addr}:{AGENT_PORT}" for a, addr in
                            zip(ids, namespaces.addresses, strict=True)})  # fmt: skip
        controller: LinkController | None = None
        unapplied = [*links.unapplied, *namespaces.unapplied]
        if unapplied:
            self.launch.notice("the kernel does not apply: " + "; ".join(unapplied))
        with namespaces:
            try:
                controller = LinkController(namespaces, links, self._epoch_unix())
                controller.start()
                for index, agent_id in enumerate(ids):
                    listen = f"{namespaces.addresses[index]}:{AGENT_PORT}"
                    self.agents.spawn(
                        index, agent_id, ["--listen", listen, "--peers", str(peers)],
                        prefix=namespaces.exec_prefix(index),
                        extra=["--no-link-shaping"],  # the kernel shapes the links
                    )  # fmt: skip
                self.agents.monitor(lambda: len(self.agents.agents))
            finally:
                self.agents.terminate()
                if controller is not None:
                    controller.close()
                    namespaces.sample()
                    self.report = {
                        "netem": namespaces.netem,
                        "unapplied": unapplied,
                        "controller_errors": controller.errors[:5],
                        "links": [m.summary() for m in namespaces.measures(ids)],
                    }
                    (self.launch.out_dir / "kernel.json").write_text(
                        json.dumps(self.report, indent=2) + "\n"
                    )

    def _epoch_unix(self) -> float:
        """The scenario's t = 0 on the wall clock."""
        return time.time() - self._clock()

    def stop(self) -> None:
        self.agents.stop()

    def progress(self) -> FleetProgress:
        return self.keeper.latest

    def records(self) -> dict[str, list[RoundRecord]]:
        return self.agents.records()

    def clock_s(self) -> float:
        return self._clock()

    @property
    def runtime(self) -> LinkRuntime | None:
        return None


def write_peers(path: Path, peers: dict[str, str]) -> None:
    """Write a static peer list (``[peers]`` of id = "host:port") for ``--peers``."""
    path.write_text("[peers]\n" + "".join(f'"{a}" = "{addr}"\n' for a, addr in peers.items()))
