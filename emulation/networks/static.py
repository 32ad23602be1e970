"""The static network: the same loss, latency and bandwidth on every directed link, on a
named topology, or on the graphs of a ``[switching]`` schedule, one after the other.

In the agent, :class:`BernoulliLinkShaper` applies them on the sending side; every draw
derives from ``(seed, sender, receiver, round, message index)`` alone, so the same seed
gives the same drops and delays whatever the thread timing, process layout or transport. In
a kernel, the loss becomes a per-packet drop probability and the bandwidth a rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from airgossip.common.seeds import hash64
from airgossip.edge.transport.base import LinkVerdict
from airgossip.emulation.networks.link_draws import BernoulliDrops
from airgossip.node.network import Clock, KernelLinkState
from airgossip.node.topology_network import TopologyLinks, TopologyNetwork


def link_rng(seed: int, sender: str, receiver: str, *keys: int) -> np.random.Generator:
    """A generator private to one (link, key...) tuple, stable across runs and machines."""
    return np.random.default_rng([seed, hash64(sender, receiver), *keys])


@dataclass(frozen=True)
class LinkSpec:
    """One directed link's impairments.

    Attributes
    ----------
    loss:
        Probability that a message is lost (Bernoulli, independent per message).
    latency_s:
        One-way delay added to every message.
    jitter_s:
        Standard deviation of a normal delay added on top (clipped at zero).
    bandwidth_bps:
        Link rate in bits per second; 0 means unlimited.
    """

    loss: float = 0.0
    latency_s: float = 0.0
    jitter_s: float = 0.0
    bandwidth_bps: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss <= 1.0:
            raise ValueError(f"loss must be within [0, 1], got {self.loss}")
        if self.latency_s < 0 or self.jitter_s < 0 or self.bandwidth_bps < 0:
            raise ValueError("latency, jitter and bandwidth must not be negative")


class BernoulliLinkShaper:
    """The same :class:`LinkSpec` on every directed link, or one per link.

    Parameters
    ----------
    default:
        Spec for links not listed in ``links``.
    seed:
        Root of every draw.
    links:
        Optional ``{(sender, receiver): LinkSpec}`` overrides.
    """

    def __init__(
        self,
        default: LinkSpec,
        *,
        seed: int = 0,
        links: dict[tuple[str, str], LinkSpec] | None = None,
    ) -> None:
        self.default = default
        self.seed = seed
        self.links = dict(links or {})

    def spec(self, sender: str, receiver: str) -> LinkSpec:
        return self.links.get((sender, receiver), self.default)

    def plan(self, sender: str, receiver: str, round: int, index: int, nbytes: int) -> LinkVerdict:
        spec = self.spec(sender, receiver)
        if spec.loss == 0 and spec.latency_s == 0 and spec.jitter_s == 0 and not spec.bandwidth_bps:
            return LinkVerdict()
        rng = link_rng(self.seed, sender, receiver, round, index)
        drop = bool(rng.random() < spec.loss)
        delay = spec.latency_s
        if spec.jitter_s:
            delay = max(0.0, delay + float(rng.normal(0.0, spec.jitter_s)))
        if spec.bandwidth_bps:
            delay += 8.0 * nbytes / spec.bandwidth_bps
        return LinkVerdict(drop=drop, delay_s=delay)


class StaticLinks(TopologyLinks):
    """A static network in one process: the topology's links, shaped by one shaper."""

    shaper: BernoulliLinkShaper

    def rate_bps(self, sender: str, receiver: str) -> float | None:
        """``[network] bandwidth_mbps`` on every link (None where it sets none)."""
        return self.shaper.spec(sender, receiver).bandwidth_bps or None


@dataclass(frozen=True)
class StaticKernelLinks:
    """The static links for a kernel: per-packet drops at the configured loss, the
    configured rate and latency, on every link, from step 0 on."""

    n: int
    loss: float
    #: 0: not limited.
    rate_bps: float
    latency_s: float
    step_s: float = 3600.0
    unapplied: tuple[str, ...] = (
        "message loss as such: the kernel drops packets and TCP retransmits them, so the "
        "configured loss becomes delay and a packet drop rate",
        "jitter",
    )

    def step_of(self, time_s: float) -> int:
        return 0

    def at(self, time_s: float) -> KernelLinkState:
        off_diagonal = ~np.eye(self.n, dtype=bool)
        return KernelLinkState(
            0,
            np.where(off_diagonal, self.loss, 0.0),
            np.where(off_diagonal, self.rate_bps or np.inf, np.inf),
            np.where(off_diagonal, self.latency_s, 0.0),
        )


class StaticNetwork(TopologyNetwork):
    """``[network]`` on the scenario's named topology (or ``[switching]`` schedule): loss,
    latency, jitter and bandwidth, the same on every directed link."""

    kind = "static"

    def describe(self) -> str:
        return f"{self.graphs()} · loss {self.config.network.loss:g}"

    def shaper(self) -> BernoulliLinkShaper:
        """The in-agent shaper of these links."""
        settings = self.config.network
        spec = LinkSpec(
            loss=settings.loss,
            latency_s=settings.latency_ms / 1000,
            jitter_s=settings.jitter_ms / 1000,
            bandwidth_bps=settings.bandwidth_mbps * 1e6,
        )
        return BernoulliLinkShaper(spec, seed=self.config.seed)

    def message_drops(self) -> BernoulliDrops | None:
        """The shaper's drops in batch, where its spec is the same on every link (always,
        as :meth:`shaper` builds it)."""
        shaper = self.shaper()
        if shaper.links:
            return None
        return BernoulliDrops(shaper.seed, shaper.default.loss)

    def runtime(
        self, ids: list[str], clock: Clock | None = None, *, journal: bool = False
    ) -> StaticLinks:
        return StaticLinks(self, self.shaper(), self.switcher())

    def kernel_links(self) -> StaticKernelLinks:
        settings = self.config.network
        return StaticKernelLinks(
            self.config.agents,
            settings.loss,
            settings.bandwidth_mbps * 1e6,
            settings.latency_ms / 1000,
        )
