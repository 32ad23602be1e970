"""One agent's links on one interface: egress rate and latency per destination (HTB, netem),
ingress drops per source (iptables), the counters, and what they measured per link."""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from airgossip.emulation.networks.kernel.reports import LinkSummary
from airgossip.emulation.networks.kernel.tools import run_command

#: The kernel rate floor (HTB needs a positive rate); links below it are also dropped.
MIN_RATE_BPS = 8_000.0
#: The rate of a link the network does not limit (the veth's own speed is the limit).
MAX_RATE_BPS = 10e9


@dataclass
class LinkMeasure:
    """One directed link as the receiver's counters saw it, beside what was applied."""

    sender: str
    receiver: str
    packets_seen: int = 0
    packets_dropped: int = 0
    bytes_delivered: int = 0
    busy_s: float = 0.0
    busy_bytes: int = 0
    applied_loss_weighted: float = 0.0  # sum over intervals of applied loss x packets seen
    applied_rate_busy: float = 0.0  # sum over busy intervals of applied rate x seconds

    @property
    def drop_rate(self) -> float | None:
        return self.packets_dropped / self.packets_seen if self.packets_seen else None

    @property
    def model_loss(self) -> float | None:
        return self.applied_loss_weighted / self.packets_seen if self.packets_seen else None

    @property
    def throughput_bps(self) -> float | None:
        return self.busy_bytes * 8.0 / self.busy_s if self.busy_s > 0 else None

    @property
    def model_rate_bps(self) -> float | None:
        return self.applied_rate_busy / self.busy_s if self.busy_s > 0 else None

    def summary(self) -> LinkSummary:
        """What was applied and measured, with the figures derived from it."""
        return LinkSummary(
            sender=self.sender, receiver=self.receiver, packets_seen=self.packets_seen,
            packets_dropped=self.packets_dropped, bytes_delivered=self.bytes_delivered,
            busy_s=self.busy_s, busy_bytes=self.busy_bytes,
            applied_loss_weighted=self.applied_loss_weighted,
            applied_rate_busy=self.applied_rate_busy, drop_rate=self.drop_rate,
            model_loss=self.model_loss, throughput_bps=self.throughput_bps,
            model_rate_bps=self.model_rate_bps,
        )  # fmt: skip


#: Packets and bytes per peer index, as read from counters.
Counts = dict[int, tuple[int, int]]

_CLASS = re.compile(r"class htb 1:(\d+) .*?overlimits (\d+)", re.S)
_COUNTER = re.compile(r'^\[(\d+):(\d+)\] -A INPUT .*--comment "?(seen|drop) (\d+)"?')


def _classes(j: int) -> tuple[int, int, int]:
    """HTB class numbers towards node ``j``: the link, its small-packet and bulk leaves
    (tc reads them as hexadecimal; they are only ever written and read back as strings)."""
    return j + 1, 1001 + j, 2001 + j


class InterfaceLinks:
    """One agent's links on its own interface: egress rate and latency per destination,
    ingress drops per source, with counters (see the module docstring).

    Parameters
    ----------
    node:
        This agent's index in the network's link matrices.
    n:
        Number of agents.
    prefix:
        What runs a command where the interface lives (``ip netns exec NS``); empty inside
        the agent's own container.
    device:
        The interface.
    netem:
        Whether the kernel has netem (latency under each class).
    """

    def __init__(
        self,
        node: int,
        n: int,
        *,
        prefix: Sequence[str] = (),
        device: str = "eth0",
        netem: bool = False,
    ) -> None:
        if not 1 <= n <= 250:
            raise ValueError("the kernel backend supports 1 to 250 agents")
        if not re.fullmatch(r"[A-Za-z0-9_.@-]{1,15}", device):
            raise ValueError(f"'{device}' is not a network interface name")
        self.node = node
        self.n = n
        self.prefix = list(prefix)
        self.device = device
        self.netem = netem
        #: Peer index -> IPv4 address the filters and rules match.
        self.addresses: dict[int, str] = {}
        self.applied_rate = np.full(n, np.nan)  # what each egress class was last given
        self.applied_loss = np.zeros(n)  # what each ingress drop rule was last given
        self._rules_written = False
        #: What this kernel cannot apply.
        self.unapplied: list[str] = []
        if not netem:
            self.unapplied.append("latency and jitter: this kernel has no netem qdisc")
        if shutil.which("ethtool") is None:
            self.unapplied.append("MTU-sized packets: without ethtool, offloads stay on")

    def _tc_batch(self, lines: list[str], *, force: bool = False) -> None:
        if lines:
            flags = ["-force"] if force else []
            run_command([*self.prefix, "tc", *flags, "-batch", "-"], stdin="\n".join(lines) + "\n")

    # -- set-up and tear-down -------------------------------------------------------------------
    def create(self, addresses: dict[int, str] | None = None) -> None:
        """Root HTB with one class per destination; counting and drop rules for the peers
        whose ``addresses`` are known (more with :meth:`set_addresses`).
        :class:`KernelUnavailable` when the kernel refuses (no ``NET_ADMIN``, say)."""
        # Segmentation offloads would make one "packet" of up to 64 KiB: a random drop
        # then costs dozens of MTU packets. Real radios carry MTU-sized frames.
        if shutil.which("ethtool"):
            run_command([*self.prefix, "ethtool", "-K", self.device, "tso", "off", "gso", "off",
                  "gro", "off"], check=False)  # fmt: skip
        dev = self.device
        batch = [
            f"qdisc replace dev {dev} root handle 1: htb default 999",
            f"class add dev {dev} parent 1: classid 1:999 htb rate 10gbit",
        ]
        for j in range(self.n):
            if j == self.node:
                continue
            # Per destination: a class at the link's rate with two leaves, small packets
            # (TCP acknowledgements) first, so that the acknowledgements of the reverse
            # direction's transfer do not queue behind this one's data and stretch its
            # round trip: a kernel queue artefact, not a property of the radio link.
            parent, small, bulk = _classes(j)
            batch += [
                f"class add dev {dev} parent 1: classid 1:{parent} htb rate 1gbit ceil 1gbit",
                f"class add dev {dev} parent 1:{parent} classid 1:{small} htb rate 100mbit "
                "ceil 1gbit prio 0",
                f"class add dev {dev} parent 1:{parent} classid 1:{bulk} htb rate 900mbit "
                "ceil 1gbit prio 1",
                f"qdisc add dev {dev} parent 1:{small} handle {small}: {self._leaf(64)}",
                f"qdisc add dev {dev} parent 1:{bulk} handle {bulk}: {self._leaf(16)}",
            ]
        self._tc_batch(batch)
        self.set_addresses(addresses or {})

    def _leaf(self, limit: int, delay_ms: float = 0.0) -> str:
        """The queue under a leaf class: netem (latency) where the kernel has it."""
        if self.netem:
            return f"netem delay {delay_ms:.3f}ms limit {limit}"
        return f"pfifo limit {limit}"

    def remove(self) -> None:
        """Take the shaping and the rules off the interface (idempotent)."""
        subprocess.run([*self.prefix, "tc", "qdisc", "del", "dev", self.device, "root"],
                       capture_output=True, timeout=30)  # fmt: skip
        subprocess.run([*self.prefix, "iptables", "-F", "INPUT"], capture_output=True, timeout=30)

    # -- addresses ------------------------------------------------------------------------------
    def set_addresses(self, addresses: dict[int, str]) -> None:
        """Match peers by these addresses from now on (filters rebuilt, counters kept)."""
        for address in addresses.values():
            ipaddress.IPv4Address(address)  # a ValueError names a bad one
        known = {j: a for j, a in addresses.items() if j != self.node and 0 <= j < self.n}
        if known == self.addresses and self._rules_written:
            return
        dev = self.device
        # Delete every filter and add them back: a moment with none sends traffic through
        # the default class (unshaped), which an address change (a restarted peer) can afford.
        subprocess.run([*self.prefix, "tc", "filter", "del", "dev", dev, "parent", "1:"],
                       capture_output=True, timeout=30)  # fmt: skip
        batch = []
        for j, address in sorted(known.items()):
            _, small, bulk = _classes(j)
            dst = f"match ip dst {address}/32"
            batch += [
                f"filter add dev {dev} parent 1: protocol ip prio 1 u32 {dst} "
                f"match u16 0x0000 0xff80 at 2 flowid 1:{small}",
                f"filter add dev {dev} parent 1: protocol ip prio 2 u32 {dst} flowid 1:{bulk}",
            ]
        self._tc_batch(batch)
        seen, dropped = self.read_counters() if self._rules_written else ({}, {})
        self.addresses = known
        self._write_rules(seen, dropped, self.applied_loss)

    # -- link state ---------------------------------------------------------------------------
    def read_counters(self) -> tuple[Counts, Counts]:
        """Packets and bytes from each source that arrived, and that were dropped."""
        seen: Counts = {}
        dropped: Counts = {}
        text = run_command([*self.prefix, "iptables-save", "-c", "-t", "filter"])
        for line in text.splitlines():
            m = _COUNTER.match(line.strip())
            if m:
                target = seen if m.group(3) == "seen" else dropped
                target[int(m.group(4))] = (int(m.group(1)), int(m.group(2)))
        return seen, dropped

    def _write_rules(self, seen: Counts, dropped: Counts, loss: np.ndarray) -> None:
        lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
        for i, address in sorted(self.addresses.items()):
            sp, sb = seen.get(i, (0, 0))
            dp, db = dropped.get(i, (0, 0))
            src = f"{address}/32"
            lines.append(f'[{sp}:{sb}] -A INPUT -s {src} -m comment --comment "seen {i}"')
            p = min(max(float(loss[i]), 0.0), 1.0)
            lines.append(
                f"[{dp}:{db}] -A INPUT -s {src} -m statistic --mode random "
                f'--probability {p:.6f} -m comment --comment "drop {i}" -j DROP'
            )
        lines.append("COMMIT")
        run_command([*self.prefix, "iptables-restore", "-c"], stdin="\n".join(lines) + "\n")
        self._rules_written = True

    def apply_egress(self, rate_bps: np.ndarray, latency_s: np.ndarray) -> None:
        """Rates (HTB) and latencies (netem) towards each destination (a row of the
        network's matrices); only the classes whose rate changed are touched."""
        dev = self.device
        batch = []
        rate = np.clip(rate_bps, MIN_RATE_BPS, MAX_RATE_BPS)
        for j in range(self.n):
            old = self.applied_rate[j]
            if j == self.node or (not np.isnan(old) and abs(rate[j] - old) < 1e-3 * rate[j]):
                continue
            burst = max(15_000, int(rate[j] / 8 * 0.005))
            r = int(rate[j])
            parent, small, bulk = _classes(j)
            batch += [
                f"class change dev {dev} parent 1: classid 1:{parent} htb rate {r}bit "
                f"ceil {r}bit burst {burst}",
                f"class change dev {dev} parent 1:{parent} classid 1:{small} htb "
                f"rate {max(r // 10, 1000)}bit ceil {r}bit burst {burst} prio 0",
                f"class change dev {dev} parent 1:{parent} classid 1:{bulk} htb "
                f"rate {max(r - r // 10, 1000)}bit ceil {r}bit burst {burst} prio 1",
            ]
            if self.netem:
                delay_ms = float(latency_s[j]) * 1000
                batch += [
                    f"qdisc change dev {dev} parent 1:{small} handle {small}: "
                    f"{self._leaf(64, delay_ms)}",
                    f"qdisc change dev {dev} parent 1:{bulk} handle {bulk}: "
                    f"{self._leaf(16, delay_ms)}",
                ]
        self._tc_batch(batch)
        self.applied_rate = rate

    def apply_ingress(self, loss: np.ndarray) -> None:
        """Packet losses of the links from each source (a column of the network's loss
        matrix), keeping the counters."""
        loss = np.clip(loss, 0.0, 1.0)
        if np.allclose(loss, self.applied_loss) and self._rules_written:
            return
        seen, dropped = self.read_counters()
        self._write_rules(seen, dropped, loss)
        self.applied_loss = loss

    def read_overlimits(self) -> dict[int, int]:
        """Times each destination's bulk class held a packet back (the link was the
        bottleneck), by destination."""
        text = run_command([*self.prefix, "tc", "-s", "class", "show", "dev", self.device])
        out = {}
        for block in text.split("class htb ")[1:]:
            m = _CLASS.search("class htb " + block)
            if m and 2001 <= int(m.group(1)) < 3000:
                out[int(m.group(1)) - 2001] = int(m.group(2))
        return out
