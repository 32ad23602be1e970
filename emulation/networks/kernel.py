"""The kernel link applier: links shaped by tc and iptables, on one interface per agent.

:class:`InterfaceLinks` shapes one agent's links on its own interface, where the kernel can:

* rate: an HTB class per destination on the interface's egress (a short pfifo under it, so
  that queueing does not add seconds of delay);
* loss: an ``iptables ... -m statistic --mode random --probability p -j DROP`` rule per
  source in the ``INPUT`` chain (dropping at the receiver, so the sender's own TCP does not
  see a local drop), preceded by a counting rule: the counters measure the packets that
  arrived and those dropped;
* latency and jitter: ``netem`` under the class when the kernel has it.

Two backends use it. :class:`NamespaceNetwork` makes one Linux network namespace per agent,
with one veth into a hub namespace that bridges them all (addresses ``10.213.0.0/24``,
private to the namespaces it creates), and :class:`LinkController` applies any network's
:class:`~emulation.networks.base.KernelLinks` to all of them from outside, step by step. In
a container, the agent applies its own share (:class:`AgentKernelLinks`: the rate and latency
of its out-links, the loss of its in-links) inside its own network namespace, following its
peers' addresses as the coordinator hands them out; that needs ``NET_ADMIN``.

What the kernel cannot apply is listed in :attr:`InterfaceLinks.unapplied` (latency and
jitter without netem, say), beside what the network itself says it models beyond a kernel
(:attr:`~emulation.networks.base.KernelLinks.unapplied`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edge.observability.telemetry import LinkPackets
from emulation.networks.base import Clock, KernelLinks, KernelLinkState

log = logging.getLogger("airgossip.kernel")
#: Tries to delete one namespace before it is reported as left behind.
DELETE_ATTEMPTS = 3

SUBNET = "10.213.0"
AGENT_PORT = 7000
#: The kernel rate floor (HTB needs a positive rate); links below it are also dropped.
MIN_RATE_BPS = 8_000.0
#: The rate of a link the network does not limit (the veth's own speed is the limit).
MAX_RATE_BPS = 10e9
#: The tools the applier runs.
TOOLS = ("ip", "tc", "iptables", "iptables-save", "iptables-restore")


class KernelUnavailable(RuntimeError):
    """This machine cannot run the kernel backend (not root, no ip/tc/iptables...)."""


@dataclass(frozen=True)
class KernelSupport:
    available: bool
    reason: str = ""
    netem: bool = False


def _run(command: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    result = subprocess.run(list(command), input=stdin, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise KernelUnavailable(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return result.stdout


def _missing_tool() -> str | None:
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (apt-get install iproute2 iptables)"
    return None


def kernel_support() -> KernelSupport:
    """Whether namespaces, tc and iptables work here, and whether netem exists."""
    if os.geteuid() != 0:
        return KernelSupport(False, "the kernel backend needs root (network namespaces)")
    missing = _missing_tool()
    if missing is not None:
        return KernelSupport(False, missing)
    probe = f"agprobe{os.getpid()}"
    try:
        _run(["ip", "netns", "add", probe])
    except KernelUnavailable as err:
        return KernelSupport(False, f"network namespaces are unavailable: {err}")
    try:
        _run(["ip", "-n", probe, "link", "set", "lo", "up"])
        inside = ["ip", "netns", "exec", probe]
        netem_probe = [*inside, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
        netem = subprocess.run(netem_probe, capture_output=True, timeout=10).returncode == 0
        try:
            _run([*inside, "iptables", "-A", "INPUT", "-m", "statistic", "--mode", "random",
                  "--probability", "0.5", "-j", "DROP"])  # fmt: skip
        except KernelUnavailable as err:
            return KernelSupport(False, f"iptables statistic drops are unavailable: {err}")
        return KernelSupport(True, "", netem)
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)


def netem_available(prefix: Sequence[str] = ()) -> bool:
    """Whether this kernel has the netem qdisc (probed on ``lo``, then removed)."""
    add = [*prefix, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
    if subprocess.run(add, capture_output=True, timeout=10).returncode != 0:
        return False
    subprocess.run([*prefix, "tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True,
                   timeout=10)  # fmt: skip
    return True


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

    def summary(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "drop_rate": self.drop_rate,
            "model_loss": self.model_loss,
            "throughput_bps": self.throughput_bps,
            "model_rate_bps": self.model_rate_bps,
        }


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
            _run([*self.prefix, "tc", *flags, "-batch", "-"], stdin="\n".join(lines) + "\n")

    # -- set-up and tear-down -------------------------------------------------------------------
    def create(self, addresses: dict[int, str] | None = None) -> None:
        """Root HTB with one class per destination; counting and drop rules for the peers
        whose ``addresses`` are known (more with :meth:`set_addresses`).
        :class:`KernelUnavailable` when the kernel refuses (no ``NET_ADMIN``, say)."""
        # Segmentation offloads would make one "packet" of up to 64 KiB: a random drop
        # then costs dozens of MTU packets. Real radios carry MTU-sized frames.
        if shutil.which("ethtool"):
            _run([*self.prefix, "ethtool", "-K", self.device, "tso", "off", "gso", "off",
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
        text = _run([*self.prefix, "iptables-save", "-c", "-t", "filter"])
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
        _run([*self.prefix, "iptables-restore", "-c"], stdin="\n".join(lines) + "\n")
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
        text = _run([*self.prefix, "tc", "-s", "class", "show", "dev", self.device])
        out = {}
        for block in text.split("class htb ")[1:]:
            m = _CLASS.search("class htb " + block)
            if m and 2001 <= int(m.group(1)) < 3000:
                out[int(m.group(1)) - 2001] = int(m.group(2))
        return out


@dataclass
class _Sample:
    time: float
    seen: dict[int, tuple[int, int]]  # link -> (packets, bytes) arriving at the receiver
    dropped: dict[int, tuple[int, int]]
    overlimits: dict[int, int]  # link -> times its HTB class held a packet back


class NamespaceNetwork:
    """``n`` namespaces on one bridge, each directed link shaped and counted.

    Parameters
    ----------
    n:
        Number of agents.
    tag:
        Short unique tag for namespace and interface names.
    """

    def __init__(self, n: int, tag: str | None = None) -> None:
        if not 1 <= n <= 250:
            raise ValueError("the kernel backend supports 1 to 250 agents")
        support = kernel_support()
        if not support.available:
            raise KernelUnavailable(support.reason)
        self.n = n
        self.netem = support.netem
        # The pid names the owner; the random part keeps a run clear of names an earlier,
        # killed run left behind (or a reused pid).
        self.tag = tag or f"ag{os.getpid()}x{secrets.token_hex(2)}"
        self.hub = f"{self.tag}-hub"
        self.namespaces = [f"{self.tag}-{i}" for i in range(n)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(n)]
        self.nodes = [
            InterfaceLinks(i, n, prefix=self.exec_prefix(i), netem=self.netem) for i in range(n)
        ]
        self.created: list[str] = []
        self.applied_rate = np.zeros((n, n))
        self.applied_loss = np.zeros((n, n))
        self.samples: list[_Sample] = []
        self._applied_at: list[tuple[np.ndarray, np.ndarray]] = []
        #: What this kernel cannot apply of a network.
        self.unapplied: list[str] = list(self.nodes[0].unapplied)

    # -- set-up and tear-down -------------------------------------------------------------------
    def create(self) -> None:
        try:
            self._create()
        except BaseException:
            self.destroy()
            raise

    def _create(self) -> None:
        _run(["ip", "netns", "add", self.hub])
        self.created.append(self.hub)
        _run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
        everyone = dict(enumerate(self.addresses))
        for i, ns in enumerate(self.namespaces):
            _run(["ip", "netns", "add", ns])
            self.created.append(ns)
            _run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                  "peer", "name", f"p{i}", "netns", self.hub])  # fmt: skip
            _run(["ip", "-n", self.hub, "link", "set", f"p{i}", "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self.nodes[i].create(everyone)

    def destroy(self) -> None:
        """Delete every namespace this network created (idempotent); a namespace that will
        not go (a busy machine's ``ip`` timing out, say) is tried again, then named in a
        warning rather than left silently."""
        left = []
        for ns in reversed(self.created):
            for attempt in range(DELETE_ATTEMPTS):
                try:
                    done = subprocess.run(
                        ["ip", "netns", "del", ns], capture_output=True, text=True, timeout=30
                    )
                except subprocess.TimeoutExpired:
                    continue
                if done.returncode == 0 or "No such file" in done.stderr:
                    break
                time.sleep(0.2 * (attempt + 1))
            else:
                left.append(ns)
        self.created.clear()
        if left:
            log.warning(
                "could not delete network namespaces %s: `ip netns del NAME` removes them",
                ", ".join(left),
            )

    def __enter__(self) -> NamespaceNetwork:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[i]]

    # -- link state ---------------------------------------------------------------------------
    def apply(self, links: KernelLinkState) -> None:
        """Apply one step's rates (HTB), latencies (netem) and packet losses (iptables),
        keeping the counters."""
        for i, node in enumerate(self.nodes):
            node.apply_egress(links.rate_bps[i], links.latency_s[i])
        for j, node in enumerate(self.nodes):
            node.apply_ingress(links.loss[:, j])
        self.applied_rate = np.clip(links.rate_bps, MIN_RATE_BPS, MAX_RATE_BPS)
        self.applied_loss = np.clip(links.loss, 0.0, 1.0)

    def sample(self) -> None:
        """Read every receiver's counters (drops, arrivals) and every sender's shaper."""
        seen: dict[int, tuple[int, int]] = {}
        dropped: dict[int, tuple[int, int]] = {}
        overlimits: dict[int, int] = {}
        now = time.monotonic()
        for j, node in enumerate(self.nodes):
            s, d = node.read_counters()
            for i, v in s.items():
                seen[i * self.n + j] = v
            for i, v in d.items():
                dropped[i * self.n + j] = v
            for k, held in node.read_overlimits().items():
                overlimits[j * self.n + k] = held
        self.samples.append(_Sample(now, seen, dropped, overlimits))
        self._applied_at.append((self.applied_rate.copy(), self.applied_loss.copy()))

    def measures(self, ids: list[str]) -> list[LinkMeasure]:
        """Per-link drop rate and throughput at the receiver, from the samples.

        Throughput counts the bytes arriving at the receiver during intervals when the
        link was the bottleneck: its HTB class held packets back in that interval and in
        both neighbouring ones (so the start and end of a transfer are left out). It is
        compared with the rate applied in those intervals.
        """
        n = self.n
        out: list[LinkMeasure] = []
        pairs = list(zip(self.samples, self.samples[1:], self._applied_at, strict=False))
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                key = i * n + j
                m = LinkMeasure(ids[i], ids[j])
                intervals = []
                for a, b, applied in pairs:
                    sp = b.seen.get(key, (0, 0))[0] - a.seen.get(key, (0, 0))[0]
                    sb = b.seen.get(key, (0, 0))[1] - a.seen.get(key, (0, 0))[1]
                    dp = b.dropped.get(key, (0, 0))[0] - a.dropped.get(key, (0, 0))[0]
                    db = b.dropped.get(key, (0, 0))[1] - a.dropped.get(key, (0, 0))[1]
                    held = b.overlimits.get(key, 0) - a.overlimits.get(key, 0)
                    m.packets_seen += sp
                    m.packets_dropped += dp
                    m.bytes_delivered += sb - db
                    m.applied_loss_weighted += sp * float(applied[1][i, j])
                    intervals.append((b.time - a.time, sb, held > 0, float(applied[0][i, j])))
                for k in range(1, len(intervals) - 1):
                    if all(intervals[x][2] for x in (k - 1, k, k + 1)):
                        dt, nbytes, _, rate = intervals[k]
                        m.busy_s += dt
                        m.busy_bytes += nbytes
                        m.applied_rate_busy += rate * dt
                out.append(m)
        return out


class LinkController:
    """Re-applies a network's links to a :class:`NamespaceNetwork` every step and samples
    the counters."""

    def __init__(
        self, network: NamespaceNetwork, links: KernelLinks, epoch: float, sample_s: float = 0.25
    ) -> None:
        self.network = network
        self.links = links
        self.epoch = epoch
        self.sample_s = min(sample_s, links.step_s)
        self.stop = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._loop, name="kernel-links", daemon=True)

    def start(self) -> None:
        self._apply()
        self._thread.start()

    def _apply(self) -> None:
        state = self.links.at(time.time() - self.epoch)
        self.network.apply(state)
        self._step = state.step

    def _loop(self) -> None:
        while not self.stop.wait(self.sample_s):
            try:
                if self.links.step_of(time.time() - self.epoch) != self._step:
                    self._apply()
                self.network.sample()
            except (KernelUnavailable, subprocess.SubprocessError) as err:
                self.errors.append(str(err))

    def close(self) -> None:
        self.stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)


#: Seconds a resolved peer host name is trusted before it is looked up again.
RESOLVE_TTL_S = 10.0


class AgentKernelLinks:
    """One agent's share of a network's kernel links, applied by the agent itself on its
    own interface (inside its own container, which needs ``NET_ADMIN``).

    Every step it gives each out-link its rate and latency on the interface's egress and each
    in-link its packet loss on the ingress (row and column ``node`` of the network's
    :class:`~emulation.networks.base.KernelLinks`). Peers are matched by address: the
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
        missing = _missing_tool()
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

    def close(self) -> dict[str, Any]:
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
        return {
            "agent": self.ids[self.node],
            "device": self.device,
            "netem": self.interface.netem,
            "unapplied": [*self.links.unapplied, *self.interface.unapplied],
            "controller_errors": self.errors[:5],
            "links": [m.summary() for _, m in sorted(self._measures.items())],
        }
