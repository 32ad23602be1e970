"""Per directed link loss, latency and bandwidth, applied on the sending side.

Every draw derives from ``(seed, sender, receiver, round, message index)`` alone, so the same
seed gives the same drops and delays whatever the thread timing, process layout or transport.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from edge.transport.base import LinkVerdict


def link_rng(seed: int, sender: str, receiver: str, *keys: int) -> np.random.Generator:
    """A generator private to one (link, key...) tuple, stable across runs and machines."""
    digest = hashlib.blake2b(f"{sender}\x00{receiver}".encode(), digest_size=8).digest()
    link = int.from_bytes(digest, "little")
    return np.random.default_rng([seed, link, *keys])


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
