"""The link state of one step: every directed link (dense ``n x n``) or the links in range
(sparse, by sender).

Both kinds answer the same questions, which is all their users ask: the handle of link
``i -> j`` (:meth:`link`), whether it exists, its figures, the nodes a node hears, and the
existing links with their figures in order of sender then receiver.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from airgossip.emulation.channel import radio

#: The per-link figures a state holds, by the name of their array.
FIGURES = ("distance_m", "rx_dbm", "sinr_db", "rate_bps", "per", "residual", "bad",
           "goodput_bps", "latency_s")  # fmt: skip
#: What a link verdict reads besides the links (:meth:`SparseLinkState.for_verdicts`).
FOR_VERDICTS = ("residual", "bad", "goodput_bps", "latency_s", "hears_idx")
#: The figures a link verdict does not read (left out of a state for verdicts).
NOT_FOR_VERDICTS = tuple(name for name in FIGURES if name not in FOR_VERDICTS)
#: What a gossip graph reads besides the links (:meth:`SparseLinkState.for_graph`).
FOR_GRAPH = ("rx_dbm",)


def chunk_loss_probability(
    exists: bool,
    bad: bool,
    residual: float,
    nbytes: int,
    packet_bytes: int,
    loss_good: float,
    loss_bad: float,
) -> float:
    """Probability that a chunk of ``nbytes`` is lost on a link with these figures."""
    if not exists:
        return 1.0
    state_loss = loss_bad if bad else loss_good
    packets = max(1, -(-nbytes // packet_bytes))
    return 1.0 - (1.0 - state_loss) * (1.0 - residual) ** packets


@dataclass(frozen=True)
class LinkState:
    """Every directed link at one step; ``[i, j]`` is the link from node i to node j."""

    step: int
    time_s: float
    positions: np.ndarray  # (n, 2) metres
    speeds: np.ndarray  # (n,) m/s
    distance_m: np.ndarray  # (n, n)
    rx_dbm: np.ndarray  # mean received power (no fast fading); -inf on the diagonal
    exists: np.ndarray  # bool: mean received power >= lowest-rate sensitivity
    sinr_db: np.ndarray  # instantaneous, with fading and interference
    rate_bps: np.ndarray  # PHY rate chosen at that SINR (or the trace's rate)
    per: np.ndarray  # packet error rate of one attempt at that rate
    residual: np.ndarray  # packet loss left after link-layer retries
    bad: np.ndarray  # bool: burst (bad) state
    goodput_bps: np.ndarray  # rate * MAC efficiency * (1 - per), or the trace's rate
    hears: np.ndarray  # bool [i, k]: node i hears node k above the carrier-sense level
    latency_s: np.ndarray  # access delay + propagation
    loss_good: float = 0.0
    loss_bad: float = 1.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.exists.shape[0])

    def for_verdicts(self) -> LinkState:
        """This state: a dense one (a small fleet) is held whole wherever it is held."""
        return self

    def for_graph(self) -> LinkState:
        """This state (see :meth:`for_verdicts`)."""
        return self

    def link(self, i: int, j: int) -> Any:
        """The handle of link i -> j: an index into every figure array."""
        return (i, j)

    def has(self, link: Any) -> bool:
        return bool(self.exists[link])

    def latency(self, link: Any, i: int = -1, j: int = -1) -> float:
        return float(self.latency_s[link])

    def figures(self, link: Any) -> tuple[bool, float, float, float, float, bool]:
        """Whether the link exists, its SINR, rate, goodput, packet error rate and burst
        state."""
        return (
            bool(self.exists[link]), float(self.sinr_db[link]), float(self.rate_bps[link]),
            float(self.goodput_bps[link]), float(self.per[link]), bool(self.bad[link]),
        )  # fmt: skip

    def chunk_loss(self, i: int, j: int, nbytes: int, packet_bytes: int) -> float:
        """Probability that a chunk of ``nbytes`` started on link i->j in this step is lost."""
        return self.chunk_loss_at((i, j), nbytes, packet_bytes)

    def chunk_loss_at(self, link: Any, nbytes: int, packet_bytes: int) -> float:
        if not self.exists[link]:
            return 1.0
        return chunk_loss_probability(True, bool(self.bad[link]), float(self.residual[link]),
                                      nbytes, packet_bytes, self.loss_good,
                                      self.loss_bad)  # fmt: skip

    def hears_of(self, i: int) -> np.ndarray:
        """The nodes node ``i`` hears (itself included), as a boolean row."""
        return np.asarray(self.hears[i])

    def link_count(self) -> int:
        return int(self.exists.sum())

    def link_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Senders and receivers of the existing links, by sender then receiver."""
        src, dst = np.nonzero(self.exists)
        return src, dst

    def values(self, name: str, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Figure ``name`` of the links ``src -> dst``."""
        return np.asarray(getattr(self, name)[src, dst])

    def link_values(self, name: str) -> np.ndarray:
        """Figure ``name`` of the existing links, in the order of :meth:`link_pairs`."""
        return np.asarray(getattr(self, name)[self.exists])

    def out_links(self, i: int) -> np.ndarray:
        """The receivers of node ``i``'s existing links."""
        return np.flatnonzero(self.exists[i])


@dataclass(frozen=True)
class SparseLinkState:
    """The links in range at one step, by sender (compressed rows): link ``k`` goes from the
    sender whose row holds ``k`` to ``dst[k]``; rows are sorted by receiver.

    A link that is not held (out of range) does not exist: its handle is ``-1``.
    ``hears_ptr``/``hears_idx`` list, per node, the nodes it hears (itself included).
    """

    step: int
    time_s: float
    positions: np.ndarray
    speeds: np.ndarray
    indptr: np.ndarray  # (n + 1,) int64
    dst: np.ndarray  # (m,) int32
    distance_m: np.ndarray
    rx_dbm: np.ndarray
    exists: np.ndarray
    sinr_db: np.ndarray
    rate_bps: np.ndarray
    per: np.ndarray
    residual: np.ndarray
    bad: np.ndarray
    goodput_bps: np.ndarray
    latency_s: np.ndarray
    hears_ptr: np.ndarray
    hears_idx: np.ndarray
    access_latency_s: float = 0.0
    loss_good: float = 0.0
    loss_bad: float = 1.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.indptr.shape[0] - 1)

    def link(self, i: int, j: int) -> int:
        lo, hi = int(self.indptr[i]), int(self.indptr[i + 1])
        k = lo + int(np.searchsorted(self.dst[lo:hi], j))
        return k if k < hi and int(self.dst[k]) == j else -1

    def has(self, link: int) -> bool:
        return link >= 0 and bool(self.exists[link])

    def latency(self, link: int, i: int = -1, j: int = -1) -> float:
        if link >= 0:
            return float(self.latency_s[link])
        d = float(np.hypot(*(self.positions[i] - self.positions[j])))
        return float(np.float32(self.access_latency_s) + np.float32(d / radio.SPEED_OF_LIGHT))

    def figures(self, link: int) -> tuple[bool, float, float, float, float, bool]:
        if link < 0:  # out of range
            return False, -np.inf, 0.0, 0.0, 1.0, False
        return (
            bool(self.exists[link]), float(self.sinr_db[link]), float(self.rate_bps[link]),
            float(self.goodput_bps[link]), float(self.per[link]), bool(self.bad[link]),
        )  # fmt: skip

    def chunk_loss(self, i: int, j: int, nbytes: int, packet_bytes: int) -> float:
        return self.chunk_loss_at(self.link(i, j), nbytes, packet_bytes)

    def chunk_loss_at(self, link: int, nbytes: int, packet_bytes: int) -> float:
        if not self.has(link):
            return 1.0
        return chunk_loss_probability(True, bool(self.bad[link]), float(self.residual[link]),
                                      nbytes, packet_bytes, self.loss_good,
                                      self.loss_bad)  # fmt: skip

    def for_verdicts(self) -> SparseLinkState:
        """This state with only what a message's verdict reads (:data:`FOR_VERDICTS`). A
        link shaper holds it for the steps it may still be asked about, so that a step past
        the model's own cache keeps about half its bytes."""
        return self._keeping(FOR_VERDICTS)

    def for_graph(self) -> SparseLinkState:
        """This state with only what a gossip graph is built from (:data:`FOR_GRAPH`): what
        the model keeps of an epoch's first step until the graph asks for it."""
        return self._keeping(FOR_GRAPH)

    def _keeping(self, names: tuple[str, ...]) -> SparseLinkState:
        """This state with the links, whether they exist and ``names`` (the arrays shared,
        not copied); every other figure and who hears whom are empty (asking for them is an
        error)."""
        dropped: dict[str, Any] = {
            name: np.zeros(0, dtype=getattr(self, name).dtype)
            for name in (*FIGURES, "hears_idx")
            if name not in names
        }
        return replace(self, **dropped)

    def hears_of(self, i: int) -> np.ndarray:
        """The nodes node ``i`` hears (itself included), as indices."""
        return self.hears_idx[self.hears_ptr[i] : self.hears_ptr[i + 1]]

    def link_count(self) -> int:
        return int(self.exists.sum())

    def _senders(self) -> np.ndarray:
        return np.repeat(np.arange(self.n, dtype=np.int64), np.diff(self.indptr))

    def link_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        keep = np.flatnonzero(self.exists)
        return self._senders()[keep], self.dst[keep].astype(np.int64)

    def values(self, name: str, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        keys = self._senders() * self.n + self.dst
        wanted = np.asarray(src, dtype=np.int64) * self.n + np.asarray(dst, dtype=np.int64)
        links = np.minimum(np.searchsorted(keys, wanted), max(0, keys.size - 1))
        if keys.size == 0 or (keys[links] != wanted).any():
            raise KeyError(f"{name}: asked for a link that is not in range")
        return np.asarray(getattr(self, name)[links])

    def link_values(self, name: str) -> np.ndarray:
        """Figure ``name`` of the existing links, in the order of :meth:`link_pairs`."""
        return np.asarray(getattr(self, name)[self.exists])

    def out_links(self, i: int) -> np.ndarray:
        lo, hi = int(self.indptr[i]), int(self.indptr[i + 1])
        return np.asarray(self.dst[lo:hi][self.exists[lo:hi]], dtype=np.int64)


AnyLinkState = LinkState | SparseLinkState
