"""The namespace network: one Linux network namespace per agent on one bridge, every
directed link shaped and counted on the agents' interfaces, and the controller that
re-applies a network's links to all of them from outside, step by step."""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
import time
from dataclasses import dataclass

import numpy as np

from airgossip.emulation.networks.kernel.interface import (
    MAX_RATE_BPS,
    MIN_RATE_BPS,
    InterfaceLinks,
    LinkMeasure,
)
from airgossip.emulation.networks.kernel.tools import (
    KernelUnavailable,
    kernel_support,
    log,
    run_command,
)
from airgossip.node.network import KernelLinks, KernelLinkState

#: Tries to delete one namespace before it is reported as left behind.
DELETE_ATTEMPTS = 3
#: The namespaces' addresses (``SUBNET.1`` ..), private to the namespaces made here.
SUBNET = "10.213.0"
#: The port agents serve gossip on inside their namespaces.
AGENT_PORT = 7000


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
        run_command(["ip", "netns", "add", self.hub])
        self.created.append(self.hub)
        run_command(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
        run_command(["ip", "-n", self.hub, "link", "set", "br0", "up"])
        everyone = dict(enumerate(self.addresses))
        for i, ns in enumerate(self.namespaces):
            run_command(["ip", "netns", "add", ns])
            self.created.append(ns)
            run_command(["ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                  "peer", "name", f"p{i}", "netns", self.hub])  # fmt: skip
            run_command(["ip", "-n", self.hub, "link", "set", f"p{i}", "master", "br0", "up"])
            run_command(["ip", "-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0"])
            run_command(["ip", "-n", ns, "link", "set", "eth0", "up"])
            run_command(["ip", "-n", ns, "link", "set", "lo", "up"])
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
