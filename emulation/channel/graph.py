"""The gossip graph that comes out of a link state: each node's strongest links, made
strongly connected where the radio allows."""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from airgossip.common.topology.graphs import SPARSE_LIMIT, Adjacency, sparse_adjacency
from airgossip.emulation.channel.state import AnyLinkState, SparseLinkState


def gossip_adjacency(
    state: AnyLinkState,
    max_out_degree: int,
    margin_db: float = 0.0,
    sensitivity_dbm: np.ndarray | None = None,
) -> Adjacency:
    """The gossip graph: each node sends to its ``max_out_degree`` strongest existing links
    (by mean received power) that clear the sensitivity by ``margin_db`` (a fade margin),
    plus the reverse of each chosen link where it exists, plus the links that make it
    strongly connected (any existing link may serve there).

    Strongest-K graphs fall apart into local clusters; when they do, each strongly
    connected component gets the strongest existing link out of it and into it, until the
    graph is strongly connected or the radio links themselves do not connect it (then the
    components gossip among themselves until mobility joins them; see docs/emulation.md).
    """
    n = state.n
    if isinstance(state, SparseLinkState):
        return _sparse_gossip_adjacency(state, max_out_degree, margin_db, sensitivity_dbm)
    adjacency = np.zeros((n, n), dtype=bool)
    if n < 2:
        return adjacency
    strength = np.where(state.exists, state.rx_dbm, -np.inf)
    preferred = strength
    if margin_db > 0 and sensitivity_dbm is not None:
        preferred = np.where(strength >= sensitivity_dbm[None, :] + margin_db, strength, -np.inf)
    k = min(max_out_degree, n - 1)
    top = np.argpartition(-preferred, k - 1, axis=1)[:, :k]
    rows = np.repeat(np.arange(n), k)
    cols = top.reshape(-1)
    keep = np.isfinite(preferred[rows, cols])
    adjacency[rows[keep], cols[keep]] = True
    # Add the reverse of every chosen link where the radio allows it. Push-sum's weights
    # settle to the Perron vector of the mixing matrix; on a lopsided directed graph (a node
    # that sends to four but hears from one) some weights sink towards 0, and a local step
    # on x moves the estimate x / y by step / y. Near-symmetric graphs keep the weights
    # within the spread of the degrees.
    adjacency |= adjacency.T & state.exists
    for _ in range(n):
        count, labels = _components(adjacency)
        if count == 1:
            break
        added = False
        for c in range(count):
            inside = np.flatnonzero(labels == c)
            outside = np.flatnonzero(labels != c)
            out_block = strength[np.ix_(inside, outside)]
            if np.isfinite(out_block).any():
                a, b = np.unravel_index(int(np.argmax(out_block)), out_block.shape)
                added |= not adjacency[inside[a], outside[b]]
                adjacency[inside[a], outside[b]] = True
            in_block = strength[np.ix_(outside, inside)]
            if np.isfinite(in_block).any():
                a, b = np.unravel_index(int(np.argmax(in_block)), in_block.shape)
                added |= not adjacency[outside[a], inside[b]]
                adjacency[outside[a], inside[b]] = True
        if not added:
            break
    return adjacency


def _by_sender_strongest_first(src: np.ndarray, strength: np.ndarray) -> np.ndarray:
    """The order of ``np.lexsort((-strength, src))`` (by sender, the strongest first, ties in
    the order given) by one stable sort of one 64-bit key: the sender above the 32 bits of
    ``-strength`` (float32) mapped to an unsigned integer that orders as the float does.
    Half the time of the two sorts at 19 M links."""
    if strength.dtype != np.float32:  # the key holds float32 only
        return np.lexsort((-strength, src))
    negated = -strength + np.float32(0.0)  # -0.0 as 0.0: the float order ties them
    bits = negated.view(np.uint32).astype(np.int64)
    key = np.where(bits & 0x80000000, ~bits & 0xFFFFFFFF, bits | 0x80000000)
    key |= src.astype(np.int64) << 32
    return np.argsort(key, kind="stable")


def _sparse_gossip_adjacency(
    state: SparseLinkState,
    max_out_degree: int,
    margin_db: float,
    sensitivity_dbm: np.ndarray | None,
) -> Adjacency:
    """:func:`gossip_adjacency` over the links a sparse state holds (the same choices: the
    strongest first, ties to the lowest receiver), kept as a flag per link until the end: dense
    ``(n, n)`` up to :data:`~airgossip.common.topology.graphs.SPARSE_LIMIT` nodes, a sparse CSR
    array above (a dense one of 100,000 nodes is 10 GB, most of it touched by the links)."""
    n = state.n
    if n < 2:
        return np.zeros((n, n), dtype=bool)
    src, dst = state.link_pairs()
    strength = state.link_values("rx_dbm")
    preferred = strength
    if margin_db > 0 and sensitivity_dbm is not None:
        preferred = np.where(strength >= sensitivity_dbm[dst] + margin_db, strength, -np.inf)
    k = min(max_out_degree, n - 1)
    order = _by_sender_strongest_first(src, preferred)
    ranked = src[order]
    rank = np.arange(order.size) - np.searchsorted(ranked, ranked, side="left")
    chosen = np.zeros(src.size, dtype=bool)  # the gossip graph's links
    chosen[order[(rank < k) & np.isfinite(preferred[order])]] = True
    del order, ranked, rank
    # The reverse of each chosen link, where the radio allows it: looked up among the links
    # (in key order) for the chosen ones only (a few a node, against tens of millions).
    keys = src.astype(np.int64) * n + dst
    picked = np.flatnonzero(chosen)
    back_keys = dst[picked].astype(np.int64) * n + src[picked]
    reverse = np.minimum(np.searchsorted(keys, back_keys), max(0, keys.size - 1))
    chosen[reverse[keys[reverse] == back_keys]] = True
    del keys, picked, back_keys, reverse
    for _ in range(n):
        count, labels = _components(sparse_adjacency(n, src[chosen], dst[chosen]))
        if count == 1:
            break
        added = False
        for c in range(count):
            inside_src, inside_dst = labels[src] == c, labels[dst] == c
            for crossing in (inside_src & ~inside_dst, ~inside_src & inside_dst):
                links = np.flatnonzero(crossing)
                if links.size:
                    best = links[int(np.argmax(strength[links]))]
                    added |= not chosen[best]
                    chosen[best] = True
        if not added:
            break
    if n > SPARSE_LIMIT:
        return sparse_adjacency(n, src[chosen], dst[chosen])
    adjacency = np.zeros((n, n), dtype=bool)
    adjacency[src[chosen], dst[chosen]] = True
    return adjacency


def _components(adjacency: Adjacency) -> tuple[int, np.ndarray]:
    count, labels = connected_components(csr_matrix(adjacency), directed=True, connection="strong")
    return int(count), labels


def strongly_connected(adjacency: Adjacency) -> tuple[bool, int]:
    """Whether a directed graph is strongly connected, and its number of strong components."""
    count, _ = _components(adjacency)
    return count == 1, count
