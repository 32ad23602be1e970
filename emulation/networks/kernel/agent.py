"""The agent's kernel links: one agent shapes its own share of a network's links on its own
interface (inside its container, with ``NET_ADMIN``), following its peers' addresses."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from airgossip.edge.observability.telemetry import LinkPackets
from airgossip.emulation.networks.kernel.interface import Counts, InterfaceLinks, LinkMeasure
from airgossip.emulation.networks.kernel.reports import AgentKernelReport
from airgossip.emulation.networks.kernel.tools import (
    KernelUnavailable,
    log,
    missing_tool,
    netem_available,
)
from airgossip.node.links import kernel_report_path
from airgossip.node.network import Clock, KernelLinks, KernelLinkState, Network
from airgossip.scenario.config import ConfigError

if TYPE_CHECKING:
    from airgossip.edge.observability.metrics import AgentMetrics
    from airgossip.node.options import AgentProcessOptions

#: Seconds a resolved peer host name is trusted before it is looked up again.
RESOLVE_TTL_S = 10.0


class AgentKernelLinks:
    """One agent's share of a network's kernel links, applied by the agent itself on its
    own interface (inside its own container, which needs ``NET_ADMIN``).

    Every step it gives each out-link its rate and latency on the interface's egress and each
    in-link its packet loss on the ingress (row and column ``node`` of the network's
    :class:`~airgossip.node.network.KernelLinks`). Peers are matched by address: the
    addresses of the agent's current assignment, followed as they change (a restarted peer
    container may come back with another).

    Parameters
    ----------
    links:
        The network's links, step by step.
    node:
        This agent's index in ``ids``.
    ids:
        Every agent id, in the network's order.
    clock:
        Seconds since the scenario's t = 0.
    device:
        The interface to shape.
    on_packets:
        Receives the in-links' packet counts at every sample.
    sample_s:
        How often the counters are read and the step checked.
    """

    def __init__(
        self,
        links: KernelLinks,
        node: int,
        ids: Sequence[str],
        clock: Clock,
        *,
        device: str = "eth0",
        on_packets: Callable[[list[LinkPackets]], None] | None = None,
        sample_s: float = 1.0,
    ) -> None:
        self.links = links
        self.node = node
        self.ids = list(ids)
        self.clock = clock
        self.device = device
        self.on_packets = on_packets
        self.sample_s = min(sample_s, links.step_s)
        self.interface = InterfaceLinks(node, len(self.ids), device=device)
        self.errors: list[str] = []
        self.stop = threading.Event()
        self._step = -1
        self._state: KernelLinkState | None = None
        self._peers: Callable[[], dict[str, str]] = dict
        self._resolved: dict[str, tuple[float, str | None]] = {}
        self._last: tuple[Counts, Counts] = ({}, {})
        self._measures: dict[int, LinkMeasure] = {}
        self._thread = threading.Thread(target=self._loop, name="kernel-links", daemon=True)

    def start(self) -> None:
        """Set the interface up and apply the current step; :class:`KernelUnavailable`
        (naming what is missing) when this process cannot shape its interface."""
        missing = missing_tool()
        if missing is not None:
            raise KernelUnavailable(missing)
        try:
            netem = netem_available()
            self.interface = InterfaceLinks(
                self.node, len(self.ids), device=self.device, netem=netem
            )
            self.interface.create()
        except KernelUnavailable as err:
            self.interface.remove()
            if "not permitted" in str(err):
                said = next(line for line in str(err).splitlines() if "not permitted" in line)
                raise KernelUnavailable(
                    f"shaping {self.device} needs the NET_ADMIN capability "
                    f"({said.rpartition('failed: ')[2]})"
                ) from None
            raise
        self._apply()

    def follow(self, peers: Callable[[], dict[str, str]]) -> None:
        """Match peers by the addresses ``peers()`` returns (``{id: "host:port"}``, read
        again at every sample) and keep the links on the current step until :meth:`close`."""
        self._peers = peers
        self._update_addresses()
        self._thread.start()

    def _apply(self) -> None:
        state = self.links.at(self.clock())
        self.interface.apply_egress(state.rate_bps[self.node], state.latency_s[self.node])
        self.interface.apply_ingress(state.loss[:, self.node])
        self._step, self._state = state.step, state

    def _address(self, host: str) -> str | None:
        host = host.strip("[]")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            return str(address) if address.version == 4 else None
        now = time.monotonic()
        cached = self._resolved.get(host)
        if cached is None or now - cached[0] > RESOLVE_TTL_S:
            try:
                resolved: str | None = socket.gethostbyname(host)
            except OSError:
                resolved = None
            cached = (now, resolved)
            self._resolved[host] = cached
        return cached[1]

    def _update_addresses(self) -> None:
        position = {agent_id: k for k, agent_id in enumerate(self.ids)}
        addresses = {}
        for peer, address in self._peers().items():
            index = position.get(peer)
            ip = self._address(address.rpartition(":")[0])
            if index is not None and index != self.node and ip is not None:
                addresses[index] = ip
        # Peers never leave the map: a message still owed on an edge that left the graph
        # crosses the same link.
        merged = {**self.interface.addresses, **addresses}
        if merged != self.interface.addresses:
            self.interface.set_addresses(merged)

    def _sample(self) -> None:
        seen, dropped = self.interface.read_counters()
        last_seen, last_dropped = self._last
        loss = self._state.loss[:, self.node] if self._state is not None else None
        for i, (packets, nbytes) in seen.items():
            m = self._measures.setdefault(i, LinkMeasure(self.ids[i], self.ids[self.node]))
            dp, db = dropped.get(i, (0, 0))
            new = packets - last_seen.get(i, (0, 0))[0]
            m.packets_seen += new
            m.packets_dropped += dp - last_dropped.get(i, (0, 0))[0]
            m.bytes_delivered += (nbytes - last_seen.get(i, (0, 0))[1]) - (
                db - last_dropped.get(i, (0, 0))[1]
            )
            if loss is not None:
                m.applied_loss_weighted += new * float(loss[i])
        self._last = (seen, dropped)
        if self.on_packets is not None:
            self.on_packets([
                LinkPackets(self.ids[i], packets, dropped.get(i, (0, 0))[0])
                for i, (packets, _) in sorted(seen.items())
            ])  # fmt: skip

    def _loop(self) -> None:
        while not self.stop.wait(self.sample_s):
            try:
                self._update_addresses()
                if self.links.step_of(self.clock()) != self._step:
                    self._apply()
                self._sample()
            except (KernelUnavailable, ValueError, subprocess.SubprocessError) as err:
                if len(self.errors) < 20:
                    self.errors.append(str(err))
                    log.warning("kernel link update failed: %s", err)

    def close(self) -> AgentKernelReport:
        """Stop following, take the shaping off the interface and report what was applied
        and measured (``links``: one entry per in-link, as the namespace backend's)."""
        self.stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        try:
            self._sample()
        except (KernelUnavailable, subprocess.SubprocessError) as err:
            self.errors.append(str(err))
        self.interface.remove()
        return AgentKernelReport(
            kernel=True,
            agent=self.ids[self.node],
            device=self.device,
            netem=self.interface.netem,
            unapplied=[*self.links.unapplied, *self.interface.unapplied],
            controller_errors=self.errors[:5],
            links=[m.summary() for _, m in sorted(self._measures.items())],
        )


def agent_kernel_links(
    network: Network, ids: list[str], options: AgentProcessOptions, metrics: AgentMetrics | None
) -> AgentKernelLinks | None:
    """The agent process's links shaped by the kernel on ``options.kernel_device`` (a
    :data:`~airgossip.node.links.KernelLinksFactory`), or None (and a line in the log, and
    the reason in ``<id>.kernel.json``) where the kernel refuses."""
    assert options.kernel_device is not None
    if options.agent_id not in ids:
        raise ConfigError(
            f"--kernel-links needs one of the fleet's agent ids ({ids[0]} to {ids[-1]}), "
            f"not '{options.agent_id}'"
        )
    links = AgentKernelLinks(
        network.kernel_links(), ids.index(options.agent_id), ids, network.wall_clock(),
        device=options.kernel_device,
        on_packets=metrics.observe_link_packets if metrics is not None else None,
    )  # fmt: skip
    try:
        links.start()
    except KernelUnavailable as err:
        log.warning(
            "%s cannot shape its links in the kernel: %s; shaping them in the agent instead",
            options.agent_id,
            err,
        )
        path = kernel_report_path(options)
        if path is not None:
            AgentKernelReport(agent=options.agent_id, kernel=False, reason=str(err)).write(path)
        return None
    log.info("%s shapes its links in the kernel on %s", options.agent_id, options.kernel_device)
    return links
