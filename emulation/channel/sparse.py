"""The channel model over the links in range: what large fleets use.

The same physics as the dense model (:mod:`airgossip.emulation.channel.model`), computed only for
the node pairs in range of each other (:mod:`airgossip.emulation.channel.in_range`): link figures
are computed for the links that exist (mean received power at least the lowest rate's
sensitivity), and interference is summed over the concurrent transmitters in range of the
receiver. Where the range covers the whole area and the draws are the dense model's
(:class:`~airgossip.emulation.channel.draws.DenseDraws`), both models give the same link state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix

from airgossip.emulation.channel import fading as fad
from airgossip.emulation.channel import radio
from airgossip.emulation.channel.in_range import InRangeChannel
from airgossip.emulation.channel.pairs import BLOCK_PAIRS, by_node
from airgossip.emulation.channel.state import SparseLinkState


class SparseChannelModel(InRangeChannel):
    """Channel state of the links in range over time for ``n`` nodes (see the module).

    ``dense_draws``: draw as the dense model does (whole ``n x n`` arrays): the same state as
    :class:`~airgossip.emulation.channel.model.ChannelModel` where the range covers the area.
    """

    def _links_estimate(self) -> int:
        return self.n * min(self.n, 256)

    # -- one step ------------------------------------------------------------------------------
    def _advance(self, step: int) -> SparseLinkState:
        self._pairs = self._next(step)
        return self._link_state(step)

    def _link_state(self, step: int) -> SparseLinkState:
        s = self._pairs
        assert s is not None
        cfg, n = self.settings, self.n
        pos = s.mobility.positions
        carrier_sense = cfg.carrier_sense
        active = self._active(step)
        is_active = np.zeros(n, dtype=bool)
        is_active[active] = True
        gain_dbi = np.float32(cfg.antenna_gain_dbi)
        tx = self.tx_dbm[:1] if (self.tx_dbm == self.tx_dbm[0]).all() else self.tx_dbm
        sens = self.sensitivity_dbm
        sens = sens[:1] if (sens == sens[0]).all() else sens
        # The links that exist, written as each block finds them into arrays of the largest
        # size the step can need (pages never written are never mapped in): the links j -> i
        # (i < j) from the start, the links i -> j from ``pairs`` on. Joined (j -> i first)
        # and stably sorted by sender they are in order: a sender's links j -> i (in the
        # pairs' order, i ascending) then its links i -> j (j ascending) are its links by
        # receiver (:func:`~airgossip.emulation.channel.pairs.by_node`).
        pairs = s.keys.size
        kinds = {"src": np.int32, "dst": np.int32, "rx": np.float32, "d": np.float32,
                 "re": np.float32, "im": np.float32, "b": bool}  # fmt: skip
        if s.burst is None:
            del kinds["b"]
        kept = {name: np.empty(2 * pairs, dtype=kind) for name, kind in kinds.items()}
        filled = [pairs, 0]  # where each direction's next links go
        # Who hears whom, likewise: a node hears i < it (the links i -> j, from the start),
        # itself (from ``pairs`` on), then j > it (j -> i, from ``pairs + n`` on).
        hearing = np.empty(2 * pairs + n, dtype=np.int32)  # the nodes that hear
        heard = np.empty(hearing.size, dtype=np.int32)  # the nodes they hear
        hearing[pairs : pairs + n] = heard[pairs : pairs + n] = np.arange(n)
        heard_to = [0, pairs + n]  # where each direction's next entries go
        # Entries by node, counted a block at a time (a count over the joined arrays casts
        # every entry to 64 bits first): whom each node hears (itself once), its links.
        hears_count = np.ones(n, dtype=np.int64)
        links_count = np.zeros(n, dtype=np.int64)
        on_air: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]] = ([], [], [])
        # A block of pairs at a time, both ways: the float64 temporaries of path loss stay
        # the size of a block, and only the links that exist are kept.
        for lo in range(0, s.keys.size, BLOCK_PAIRS):
            block = slice(lo, lo + BLOCK_PAIRS)
            i, j = s.keys[block] // n, s.keys[block] % n
            d = s.distance[block]
            loss, sigma = self._path_loss(d, s.los_draw[block], i, j)
            faded = sigma * s.shadow[block]
            for side, (a, b) in enumerate(((i, j), (j, i))):
                rx = (tx[a if tx.size > 1 else 0] + gain_dbi - loss - faded).astype(np.float32)
                exists = rx >= sens[b if sens.size > 1 else 0]
                # hears[b, a]: b hears a above the carrier-sense level, or (scheduled access)
                # a's link to b exists.
                hear = np.float32(carrier_sense) <= rx if carrier_sense is not None else exists
                h = np.flatnonzero(hear)
                to = slice(heard_to[side], heard_to[side] + h.size)
                heard_to[side] += h.size
                hears_count += np.bincount(b[h], minlength=n)
                hearing[to], heard[to] = b[h], a[h]
                del h
                if active.size:
                    act = is_active[a]
                    on_air[0].append(a[act])
                    on_air[1].append(b[act])
                    on_air[2].append(np.power(np.float32(10.0), rx[act] / np.float32(10.0)))
                k = np.flatnonzero(exists)
                to = slice(filled[side], filled[side] + k.size)
                filled[side] += k.size
                links_count += np.bincount(a[k], minlength=n)
                kept["src"][to] = a[k]
                kept["dst"][to] = b[k]
                kept["rx"][to] = rx[k]
                kept["d"][to] = d[k]
                kept["re"][to] = s.scatter[side, 0, block][k]
                kept["im"][to] = s.scatter[side, 1, block][k]
                if s.burst is not None:
                    kept["b"][to] = s.burst[block, side][k]
            del loss, sigma, faded
        first = heard_to[0]  # entries i -> j
        h_rows = np.concatenate((hearing[:first], hearing[pairs : heard_to[1]]))
        del hearing
        order = by_node(h_rows, n)
        np.add(order, pairs - first, out=order, where=order >= first)
        hears_idx = heard[order]
        hears_ptr = np.concatenate([[0], np.cumsum(hears_count)])
        del h_rows, heard, order
        interferers = self._interferers(is_active, on_air, hears_ptr, hears_idx)
        del on_air
        # The links put in order (by sender, then receiver) before their figures are
        # computed: their places in ``kept`` in that order (``order``); then the figures a
        # block of links at a time straight into the step's arrays (every figure is
        # element-wise: the same values as over the whole arrays, without whole-size
        # temporaries).
        backward, forward = filled[1], filled[0] - pairs
        total = backward + forward
        src = np.concatenate((kept["src"][:backward], kept["src"][pairs : pairs + forward]))
        order = by_node(src, n)
        indptr = np.concatenate([[0], np.cumsum(links_count)]).astype(np.int64)
        del src
        np.add(order, pairs - backward, out=order, where=order >= backward)
        # What the state keeps, in order; the rest is read a block at a time.
        dst, distance, rx = (kept.pop(name)[order] for name in ("dst", "d", "rx"))
        t = step * self.step_s
        trace_values = self._trace_values(t)
        figures: dict[str, np.ndarray] = {}
        for lo in range(0, max(1, total), BLOCK_PAIRS):
            part = slice(lo, lo + BLOCK_PAIRS)
            links = {name: a[order[part]] for name, a in kept.items()}
            links.update(dst=dst[part], d=distance[part], rx=rx[part])
            computed = self._link_figures(links, interferers, trace_values)
            del links
            for name, values in computed.items():
                out = figures.get(name)
                if out is None:
                    out = figures[name] = np.empty(total, dtype=values.dtype)
                out[part] = values
            del computed
        del kept, order
        loss_good, loss_bad = self._loss_states()
        return SparseLinkState(
            step=step, time_s=t, positions=pos.copy(), speeds=s.mobility.speeds.copy(),
            indptr=indptr, exists=np.ones(total, dtype=bool), hears_ptr=hears_ptr,
            hears_idx=hears_idx, access_latency_s=cfg.latency_ms / 1000.0,
            loss_good=loss_good, loss_bad=loss_bad, dst=dst, distance_m=distance, rx_dbm=rx,
            sinr_db=figures["sinr_db"], rate_bps=figures["rate_bps"], per=figures["per"],
            residual=figures["residual"], bad=figures["bad"],
            goodput_bps=figures["goodput_bps"], latency_s=figures["latency_s"],
        )  # fmt: skip

    def _link_figures(
        self,
        links: dict[str, np.ndarray],
        interferers: _Interferers,
        trace_values: list[np.float32],
    ) -> dict[str, np.ndarray]:
        """The figures of a block of links (``links``: their senders, receivers, received
        power, distance, fading parts and burst states, as :meth:`_link_state` joins them)."""
        cfg = self.settings
        src, dst, rx = links["src"], links["dst"], links["rx"]
        interference = interferers.at(src, dst, rx)
        rx_mw = np.power(np.float32(10.0), rx / np.float32(10.0))
        re, im = links["re"], links["im"]
        gain = fad.power_gain_parts(re, im, self.k_factor) if cfg.fading.model != "none" else 1.0
        noise_mw = np.power(10.0, self.noise_dbm / 10.0).astype(np.float32)
        sinr_lin = rx_mw * gain / (noise_mw[dst] + interference)
        del rx_mw, gain, interference
        masks = [mask[src, dst] for _, mask in self.trace_links]
        index, sinr_db, rate, per, residual, goodput = self._figures(sinr_lin, masks, trace_values)
        del sinr_lin, masks
        if self.gilbert is not None and "b" in links:
            bad = links["b"].astype(bool)
        elif cfg.burst.model == "fading":
            bad = index < 0
        else:
            bad = np.zeros(src.size, dtype=bool)
        latency = (
            np.float32(cfg.latency_ms / 1000.0) + links["d"] / np.float32(radio.SPEED_OF_LIGHT)
        ).astype(np.float32)
        return {"sinr_db": sinr_db, "rate_bps": rate, "per": per, "residual": residual,
                "bad": bad, "goodput_bps": goodput, "latency_s": latency}  # fmt: skip

    def _interferers(
        self,
        is_active: np.ndarray,
        on_air: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]],
        hears_ptr: np.ndarray,
        hears_idx: np.ndarray,
    ) -> _Interferers:
        """The step's concurrent transmitters in range (``on_air``: their links and powers)
        as :class:`_Interferers` sees them: the power of all of them at each receiver and,
        under CSMA, the part each sender hears (those defer to it)."""
        n = self.n
        if not on_air[0]:
            return _Interferers(n, is_active, None, None, None)
        src, dst, power = (np.concatenate(x) for x in on_air)
        order = np.argsort(src, kind="stable")
        src, dst, power = src[order], dst[order], power[order]
        total = np.zeros(n, dtype=np.float32)
        np.add.at(total, dst, power)  # in order of transmitter, as the dense model's sum
        if self.settings.carrier_sense is None:
            return _Interferers(n, is_active, total, None, None)
        rows = np.repeat(np.arange(n), np.diff(hears_ptr))
        heard_active = is_active[hears_idx]
        hears = csr_matrix(
            (np.ones(int(heard_active.sum()), dtype=np.float32),
             (rows[heard_active], hears_idx[heard_active])), shape=(n, n),
        )  # fmt: skip
        reach = csr_matrix((power, (src, dst)), shape=(n, n))
        heard = (hears @ reach).tocsr()
        heard.sort_indices()
        h_keys = np.repeat(np.arange(n, dtype=np.int64), np.diff(heard.indptr)) * n + heard.indices
        return _Interferers(n, is_active, total, h_keys, np.asarray(heard.data))


@dataclass
class _Interferers:
    """A step's concurrent transmitters as the links' receivers hear them (see
    :meth:`SparseChannelModel._interferers`): ``total`` at each node (None: none on the
    air); under CSMA ``heard``, the power at ``j`` of those ``k`` hears, by key ``k * n + j``
    (sorted); under scheduled access (``keys`` None) every active node but the sender
    interferes."""

    n: int
    is_active: np.ndarray
    total: np.ndarray | None
    keys: np.ndarray | None
    heard: np.ndarray | None

    def at(self, ks: np.ndarray, js: np.ndarray, rx: np.ndarray) -> np.ndarray:
        """Interference at the receiver of each link ``ks -> js`` (``rx``: its received
        power, dBm)."""
        if self.total is None:
            return np.zeros(ks.size, dtype=np.float32)
        if self.keys is None or self.heard is None:
            own = np.where(
                self.is_active[ks], np.power(np.float32(10.0), rx / np.float32(10.0)), 0.0
            ).astype(np.float32)
            return np.asarray(np.maximum(self.total[js] - own, 0.0), dtype=np.float32)
        h_keys = self.keys
        wanted = ks.astype(np.int64) * self.n + js
        at = np.minimum(np.searchsorted(h_keys, wanted), max(0, h_keys.size - 1))
        values = np.zeros(ks.size, dtype=np.float32)
        if h_keys.size:
            hit = h_keys[at] == wanted
            values[hit] = self.heard[at[hit]]
        return np.asarray(np.maximum(self.total[js] - values, 0.0), dtype=np.float32)
