"""The kernel link applier: namespaces on one bridge, links shaped by tc and iptables.

:class:`NamespaceNetwork` makes one Linux network namespace per agent, with one veth into a
hub namespace that bridges them all (addresses ``10.213.0.0/24``, private to the namespaces
it creates). :class:`LinkController` applies any network's
:class:`~emulation.networks.base.KernelLinks` to it, step by step, where the kernel can:

* rate: an HTB class per destination on the sender's veth (a short pfifo under it, so that
  queueing does not add seconds of delay);
* loss: an ``iptables ... -m statistic --mode random --probability p -j DROP`` rule per
  source in the receiver's ``INPUT`` chain (dropping at the receiver, so the sender's own TCP
  does not see a local drop), preceded by a counting rule: the receivers' counters measure
  the packets that arrived and those dropped;
* latency and jitter: ``netem`` under the class when the kernel has it.

What the kernel cannot apply is listed in :attr:`NamespaceNetwork.unapplied` (latency and
jitter without netem, say), beside what the network itself says it models beyond a kernel
(:attr:`~emulation.networks.base.KernelLinks.unapplied`).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from emulation.networks.base import KernelLinks, KernelLinkState

SUBNET = "10.213.0"
AGENT_PORT = 7000
#: The kernel rate floor (HTB needs a positive rate); links below it are also dropped.
MIN_RATE_BPS = 8_000.0
#: The rate of a link the network does not limit (the veth's own speed is the limit).
MAX_RATE_BPS = 10e9


class KernelUnavailable(RuntimeError):
    """This machine cannot run the kernel backend (not root, no ip/tc/iptables...)."""


@dataclass(frozen=True)
class KernelSupport:
    available: bool
    reason: str = ""
    netem: bool = False


def _run(command: list[str], *, stdin: str | None = None, check: bool = True) -> str:
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise KernelUnavailable(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return result.stdout


def kernel_support() -> KernelSupport:
    """Whether namespaces, tc and iptables work here, and whether netem exists."""
    if os.geteuid() != 0:
        return KernelSupport(False, "the kernel backend needs root (network namespaces)")
    for tool in ("ip", "tc", "iptables", "iptables-save", "iptables-restore"):
        if shutil.which(tool) is None:
            return KernelSupport(
                False, f"'{tool}' is not installed (apt-get install iproute2 iptables)"
            )
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


@dataclass
class _Sample:
    time: float
    seen: dict[int, tuple[int, int]]  # link -> (packets, bytes) arriving at the receiver
    dropped: dict[int, tuple[int, int]]
    overlimits: dict[int, int]  # link -> times its HTB class held a packet back


_CLASS = re.compile(r"class htb 1:(\d+) .*?overlimits (\d+)", re.S)


_COUNTER = re.compile(r"^\[(\d+):(\d+)\] -A INPUT -s " + re.escape(SUBNET) + r"\.(\d+)/32 (.*)$")


def _classes(j: int) -> tuple[int, int, int]:
    """HTB class numbers towards node ``j``: the link, its small-packet and bulk leaves
    (tc reads them as hexadecimal; they are only ever written and read back as strings)."""
    return j + 1, 1001 + j, 2001 + j


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
        self.created: list[str] = []
        self.applied_rate = np.zeros((n, n))
        self.applied_loss = np.zeros((n, n))
        self.samples: list[_Sample] = []
        self._applied_at: list[tuple[np.ndarray, np.ndarray]] = []
        #: What this kernel cannot apply of a network.
        self.unapplied: list[str] = []
        if not self.netem:
            self.unapplied.append("latency and jitter: this kernel has no netem qdisc")
        if shutil.which("ethtool") is None:
            self.unapplied.append("MTU-sized packets: without ethtool, offloads stay on")

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
        for i, ns in enumerate(self.namespaces):
            _run(["ip", "netns", "add", ns])
            self.created.append(ns)
            _run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                  "peer", "name", f"p{i}", "netns", self.hub])  # fmt: skip
            _run(["ip", "-n", self.hub, "link", "set", f"p{i}", "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            # Segmentation offloads would make one "packet" of up to 64 KiB: a random drop
            # then costs dozens of MTU packets. Real radios carry MTU-sized frames.
            if shutil.which("ethtool"):
                _run(
                    [
                        *self.exec_prefix(i),
                        "ethtool",
                        "-K",
                        "eth0",
                        "tso",
                        "off",
                        "gso",
                        "off",
                        "gro",
                        "off",
                    ],
                    check=False,
                )
            batch = [
                "qdisc add dev eth0 root handle 1: htb default 999",
                "class add dev eth0 parent 1: classid 1:999 htb rate 10gbit",
            ]
            for j in range(self.n):
                if j == i:
                    continue
                # Per destination: a class at the link's rate with two leaves, small packets
                # (TCP acknowledgements) first, so that the acknowledgements of the reverse
                # direction's transfer do not queue behind this one's data and stretch its
                # round trip: a kernel queue artefact, not a property of the radio link.
                parent, small, bulk = _classes(j)
                dst = f"match ip dst {self.addresses[j]}/32"
                batch += [
                    f"class add dev eth0 parent 1: classid 1:{parent} htb rate 1gbit ceil 1gbit",
                    f"class add dev eth0 parent 1:{parent} classid 1:{small} htb rate 100mbit "
                    "ceil 1gbit prio 0",
                    f"class add dev eth0 parent 1:{parent} classid 1:{bulk} htb rate 900mbit "
                    "ceil 1gbit prio 1",
                    f"qdisc add dev eth0 parent 1:{small} handle {small}: {self._leaf(64)}",
                    f"qdisc add dev eth0 parent 1:{bulk} handle {bulk}: {self._leaf(16)}",
                    f"filter add dev eth0 parent 1: protocol ip prio 1 u32 {dst} "
                    f"match u16 0x0000 0xff80 at 2 flowid 1:{small}",
                    f"filter add dev eth0 parent 1: protocol ip prio 2 u32 {dst} flowid 1:{bulk}",
                ]
            _run(["ip", "netns", "exec", ns, "tc", "-batch", "-"], stdin="\n".join(batch) + "\n")
            self._write_rules(i, {}, np.zeros(self.n))

    def _leaf(self, limit: int, delay_ms: float = 0.0) -> str:
        """The queue under a leaf class: netem (latency) where the kernel has it."""
        if self.netem:
            return f"netem delay {delay_ms:.3f}ms limit {limit}"
        return f"pfifo limit {limit}"

    def destroy(self) -> None:
        """Delete every namespace this network created (idempotent)."""
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.created.clear()

    def __enter__(self) -> NamespaceNetwork:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[i]]

    # -- link state ---------------------------------------------------------------------------
    def _read_counters(
        self, j: int
    ) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
        seen: dict[int, tuple[int, int]] = {}
        dropped: dict[int, tuple[int, int]] = {}
        text = _run([*self.exec_prefix(j), "iptables-save", "-c", "-t", "filter"])
        for line in text.splitlines():
            m = _COUNTER.match(line.strip())
            if not m:
                continue
            packets, nbytes, src = int(m.group(1)), int(m.group(2)), int(m.group(3)) - 1
            if "-j DROP" in m.group(4):
                dropped[src] = (packets, nbytes)
            else:
                seen[src] = (packets, nbytes)
        return seen, dropped

    def _write_rules(
        self, j: int, counters: dict[int, tuple[tuple[int, int], tuple[int, int]]], loss: np.ndarray
    ) -> None:
        lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
        for i in range(self.n):
            if i == j:
                continue
            (sp, sb), (dp, db) = counters.get(i, ((0, 0), (0, 0)))
            src = f"{self.addresses[i]}/32"
            lines.append(f'[{sp}:{sb}] -A INPUT -s {src} -m comment --comment "seen {i}"')
            p = min(max(float(loss[i]), 0.0), 1.0)
            lines.append(
                f"[{dp}:{db}] -A INPUT -s {src} -m statistic --mode random "
                f"--probability {p:.6f} -j DROP"
            )
        lines.append("COMMIT")
        _run([*self.exec_prefix(j), "iptables-restore", "-c"], stdin="\n".join(lines) + "\n")

    def apply(self, links: KernelLinkState) -> None:
        """Apply one step's rates (HTB), latencies (netem) and packet losses (iptables),
        keeping the counters."""
        n = self.n
        loss = np.clip(links.loss, 0.0, 1.0)
        rate = np.clip(links.rate_bps, MIN_RATE_BPS, MAX_RATE_BPS)
        for i in range(n):
            batch = []
            for j in range(n):
                if i == j or abs(rate[i, j] - self.applied_rate[i, j]) < 1e-3 * rate[i, j]:
                    continue
                burst = max(15_000, int(rate[i, j] / 8 * 0.005))
                r = int(rate[i, j])
                parent, small, bulk = _classes(j)
                batch += [
                    f"class change dev eth0 parent 1: classid 1:{parent} htb rate {r}bit "
                    f"ceil {r}bit burst {burst}",
                    f"class change dev eth0 parent 1:{parent} classid 1:{small} htb "
                    f"rate {max(r // 10, 1000)}bit ceil {r}bit burst {burst} prio 0",
                    f"class change dev eth0 parent 1:{parent} classid 1:{bulk} htb "
                    f"rate {max(r - r // 10, 1000)}bit ceil {r}bit burst {burst} prio 1",
                ]
                if self.netem:
                    delay_ms = float(links.latency_s[i, j]) * 1000
                    batch += [
                        f"qdisc change dev eth0 parent 1:{small} handle {small}: "
                        f"{self._leaf(64, delay_ms)}",
                        f"qdisc change dev eth0 parent 1:{bulk} handle {bulk}: "
                        f"{self._leaf(16, delay_ms)}",
                    ]
            if batch:
                _run([*self.exec_prefix(i), "tc", "-batch", "-"], stdin="\n".join(batch) + "\n")
        for j in range(n):
            if np.allclose(loss[:, j], self.applied_loss[:, j]):
                continue
            seen, dropped = self._read_counters(j)
            counters = {i: (seen.get(i, (0, 0)), dropped.get(i, (0, 0))) for i in range(n)}
            self._write_rules(j, counters, loss[:, j])
        self.applied_rate, self.applied_loss = rate, loss

    def _read_overlimits(self, i: int) -> dict[int, int]:
        text = _run([*self.exec_prefix(i), "tc", "-s", "class", "show", "dev", "eth0"])
        out = {}
        for block in text.split("class htb ")[1:]:
            m = _CLASS.search("class htb " + block)
            # The bulk leaf is the one that holds data back when the link is the bottleneck.
            if m and 2001 <= int(m.group(1)) < 3000:
                out[i * self.n + int(m.group(1)) - 2001] = int(m.group(2))
        return out

    def sample(self) -> None:
        """Read every receiver's counters (drops, arrivals) and every sender's shaper."""
        seen: dict[int, tuple[int, int]] = {}
        dropped: dict[int, tuple[int, int]] = {}
        overlimits: dict[int, int] = {}
        now = time.monotonic()
        for j in range(self.n):
            s, d = self._read_counters(j)
            for i, v in s.items():
                seen[i * self.n + j] = v
            for i, v in d.items():
                dropped[i * self.n + j] = v
            overlimits.update(self._read_overlimits(j))
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
