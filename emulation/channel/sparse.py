"""The channel model over the links in range: what large fleets use.

The same physics as the dense model (:mod:`airgossip.emulation.channel.model`), computed only for
the node pairs within :attr:`SparseChannelModel.range_m` of each other (a k-d tree finds them each
step, or a scan of every pair where most are in range): shadowing, line of sight and fast fading are
held per pair in range, link figures are computed for the links that exist (mean received power at
least the lowest rate's sensitivity), and interference is summed over the concurrent transmitters in
range of the receiver. A pair that comes into range starts from a fresh draw of its stationary
distribution.

``range_m`` is the distance past which path loss leaves a link below the sensitivity even
with shadowing :data:`SHADOW_MARGIN` standard deviations in its favour (where line of sight
is drawn per pair: non line of sight, and line of sight while its probability is at least
:data:`LOS_CUTOFF`); links beyond it (a rare line-of-sight pair far away, a deeper shadowing
tail) are not modelled, nor is the interference of transmitters beyond it. Where ``range_m``
covers the whole area and the draws are the dense model's
(:class:`~airgossip.emulation.channel.draws.DenseDraws`), both models give the same link state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.spatial import cKDTree

from airgossip.emulation.channel import fading as fad
from airgossip.emulation.channel import radio
from airgossip.emulation.channel.base import BURST, FADING, LOS, MOBILITY, SHADOW, ChannelBase
from airgossip.emulation.channel.draws import DenseDraws, Draws, StreamDraws
from airgossip.emulation.channel.heap import keep_block_temporaries
from airgossip.emulation.channel.mobility import MobilityState
from airgossip.emulation.channel.pairs import (
    BLOCK_PAIRS,
    by_node,
    next_set,
    pair_distances,
    scan_rows,
)
from airgossip.emulation.channel.state import SparseLinkState
from airgossip.emulation.scenario import WirelessSettings

#: Up to this many node pairs, the pairs in range are found by measuring every pair, a block
#: of rows at a time, when they are most of the pairs (:func:`.pairs.scan_rows`).
ROW_SCAN_PAIRS = 1 << 27

#: Shadowing in a link's favour, in standard deviations, that the range still covers.
SHADOW_MARGIN = 3.0
#: Where line of sight is drawn per pair, the range also covers line-of-sight links out to
#: where their probability falls below this.
LOS_CUTOFF = 0.01


@dataclass
class _Pairs:
    """The internal state of the pairs in range (``i < j``, key ``i * n + j``, sorted)."""

    mobility: MobilityState
    keys: np.ndarray  # int64
    distance: np.ndarray  # float32 metres
    near: np.ndarray | None  # bool: which pairs of the row scan are the keys (see pairs.scan_rows)
    shadow: np.ndarray  # float32, unit variance
    los_draw: np.ndarray  # float32 uniform: line of sight while below P_LOS(d)
    scatter: np.ndarray  # float32 (2, 2, p): [0] i -> j, [1] j -> i; real, imaginary parts
    burst: np.ndarray | None  # bool (p, 2) Gilbert-Elliott states


class SparseChannelModel(ChannelBase):
    """Channel state of the links in range over time for ``n`` nodes (see the module).

    ``dense_draws``: draw as the dense model does (whole ``n x n`` arrays): the same state as
    :class:`~airgossip.emulation.channel.model.ChannelModel` where the range covers the area.
    """

    def __init__(
        self,
        settings: WirelessSettings,
        n: int,
        seed: int,
        cache_steps: int | None = None,
        *,
        dense_draws: bool = False,
        range_m: float | None = None,
    ) -> None:
        self._pairs: _Pairs | None = None
        keep_block_temporaries()  # a block's temporaries reused, not faulted in each block
        super().__init__(settings, n, seed, 2 if cache_steps is None else cache_steps)
        self.draws: Draws = DenseDraws(seed, n) if dense_draws else StreamDraws(seed)
        self.range_m = self._range() if range_m is None else range_m
        area = settings.mobility.area_m
        self._covers_area = self.range_m >= float(np.hypot(area[0], area[1]))

    def _links_estimate(self) -> int:
        return self.n * min(self.n, 256)

    def _restart(self) -> None:
        self._pairs = None

    def _range(self) -> float:
        """Where the dominant path loss, with :data:`SHADOW_MARGIN` sigmas of shadowing in the
        link's favour, leaves the strongest sender below the weakest receiver's sensitivity."""
        budget = float(self.tx_dbm.max()) + self.settings.antenna_gain_dbi
        budget -= float(self.sensitivity_dbm.min())
        pl = self.settings.path_loss
        distances = np.geomspace(1.0, 1e6, 4000)
        # The least loss any pair could have: both ends at the highest antenna (the
        # breakpoint furthest, UMi/UMa's NLOS height term largest) and no height between them.
        high = float(self.height_m.max()) if self.n else 1.5
        if pl.model in ("log-distance", "free-space"):
            exponent = pl.exponent if pl.model == "log-distance" else 2.0
            loss = radio.log_distance_loss_db(distances, self.frequency_hz, exponent)
        else:
            name = f"{pl.model}-nlos" if self._mixed_los else pl.model
            loss = radio.path_loss_38901_db(name, distances, self.frequency_hz, high, high)
        reach = self._reach(distances, loss - SHADOW_MARGIN * self.shadow_sigma_db <= budget)
        if self._mixed_los:  # line of sight reaches further, while it is likely enough
            los = f"{pl.model}-los"
            sigma = radio.PATH_LOSS_38901[los][3]
            loss = radio.path_loss_38901_db(los, distances, self.frequency_hz, high, high)
            likely = radio.los_probability(pl.model, distances, high) >= LOS_CUTOFF
            reach = max(reach, self._reach(distances, likely & (loss - 3 * sigma <= budget)))
        return reach

    @staticmethod
    def _reach(distances: np.ndarray, within: np.ndarray) -> float:
        inside = np.flatnonzero(within)
        return float(distances[min(inside[-1] + 1, distances.size - 1)]) if inside.size else 1.0

    # -- the pairs in range --------------------------------------------------------------------
    def _candidates(
        self, positions: np.ndarray, previous: int | None = None, reuse: _Pairs | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The keys of the pairs in range, sorted, their distances (float32) and, where
        the row scan found them, its flags (:func:`~airgossip.emulation.channel.pairs.scan_rows`).

        ``previous``: how many pairs the step before held (picks how they are found; the
        pairs and distances are the same either way). ``reuse``: the step before, found by
        a row scan, whose keys and distances a row scan may write over (the step reads
        only its flags then)."""
        n = self.n
        if self._covers_area:
            i, j = np.triu_indices(n, 1)
            keys = i.astype(np.int64) * n + j
            return keys, pair_distances(positions, keys, n), None
        pairs = n * (n - 1) // 2
        if pairs <= ROW_SCAN_PAIRS:
            if previous is None:
                area = self.settings.mobility.area_m
                share = np.pi * self.range_m**2 / max(1.0, float(area[0]) * float(area[1]))
            else:
                share = previous / max(1, pairs)
            if share >= 0.25:
                old = (reuse.keys, reuse.distance) if reuse is not None else None
                return scan_rows(positions, self.range_m, old)
        found = cKDTree(positions).query_pairs(self.range_m, output_type="ndarray")
        i, j = found[:, 0], found[:, 1]  # i < j
        keys = i.astype(np.int64) * n + j
        # The k-d tree lists pairs in runs by their first node: a merge sort takes those
        # runs as they are (2.0 s against 3.5 s for 46 M pairs; the keys are unique, so
        # both give the same array).
        keys.sort(kind="stable")
        return keys, pair_distances(positions, keys, n), None

    def _reverse(self, keys: np.ndarray) -> np.ndarray:
        """The keys of the pairs' other direction (only the dense draws look at keys)."""
        if not isinstance(self.draws, DenseDraws):
            return keys
        return np.asarray((keys % self.n) * self.n + keys // self.n)

    def _first(self, mob: MobilityState) -> _Pairs:
        keys, distance, near = self._candidates(mob.positions)
        d = self.draws
        scatter = np.empty((2, 2, keys.size), dtype=np.float32)
        d.complex_normal(FADING, 0, keys, out=scatter[0])
        d.complex_normal(FADING, 0, self._reverse(keys), 1, out=scatter[1])
        burst = None
        if self.gilbert is not None:
            burst = self.gilbert.initial(
                np.stack(
                    [d.uniform(BURST, 0, keys), d.uniform(BURST, 0, self._reverse(keys), 1)], 1
                )
            )
        return _Pairs(
            mob,
            keys,
            distance,
            near,
            d.normal(SHADOW, 0, keys),
            d.uniform(LOS, 0, keys),
            scatter,
            burst,
        )

    def _next(self, step: int) -> _Pairs:
        n, dt, d = self.n, self.step_s, self.draws
        mob_rng = self._rng(MOBILITY, step)
        if self._pairs is None:
            return self._first(self.mobility.initial(n, mob_rng))
        # The previous step's arrays are let go as soon as they are used up: a step's peak
        # holds the old pairs and the new ones (at 10,000 agents in lte-urban's 2 km square,
        # 46 M pairs of about 32 bytes each, and as much again in temporaries).
        s, self._pairs = self._pairs, None
        mob = self.mobility.step(s.mobility, dt, mob_rng)
        moved = np.linalg.norm(mob.positions - s.mobility.positions, axis=1).astype(np.float32)
        still = np.array_equal(mob.positions, s.mobility.positions)
        if still:
            keys, distance, near = s.keys, s.distance, s.near
        else:
            reuse = s if s.near is not None else None  # (its keys are read otherwise)
            keys, distance, near = self._candidates(mob.positions, s.keys.size, reuse)
        s.distance = distance  # (the old distances are not needed)
        # Which pairs were in range the step before, and where they were: ``at`` (the old
        # places of the pairs found, in order), or after two row scans the old pairs' flags
        # of which stayed (``stayed``), read a block at a time (a whole ``at`` is 8 bytes a
        # pair, at 10,000 nodes the step's peak).
        stayed: np.ndarray | None = None
        if near is not None and s.near is not None:  # both row scans: flags in one order
            found, stayed, at = s.near[near], near[s.near], np.zeros(0, dtype=np.int64)
        else:
            at = np.minimum(np.searchsorted(s.keys, keys), max(0, s.keys.size - 1))
            found = s.keys[at] == keys if s.keys.size else np.zeros(keys.size, dtype=bool)
            at = at[found]
        s.keys = keys  # (the old keys are not needed past here)
        new = np.flatnonzero(~found)
        # Every pair's draws of this step (a generator each, in the order of the keys); new
        # pairs start stationary from them.
        shadow = d.normal(SHADOW, step, keys)
        los = np.empty(keys.size, dtype=np.float32)
        los[new] = d.uniform(LOS, 0, keys[new], step + 1)  # the dense draws ignore the sub
        del new
        reverse = self._reverse(keys)
        scatter = np.empty((2, 2, keys.size), dtype=np.float32)
        d.complex_normal(FADING, step, keys, out=scatter[0])
        d.complex_normal(FADING, step, reverse, 1, out=scatter[1])
        # Pairs still in range continue their processes: a block of pairs at a time, so the
        # temporaries stay the size of a block (the same element-wise operations as on the
        # whole arrays, so the same values).
        speeds = mob.speeds.astype(np.float32)
        env = np.float32(self.settings.fading.environment_speed_mps)
        decorrelation = np.float32(self.decorrelation_m)
        done = 0  # found pairs before the block (or, with ``stayed``, the next old place)
        for lo in range(0, keys.size, BLOCK_PAIRS):
            block = slice(lo, lo + BLOCK_PAIRS)
            kept = found[block]
            count = int(np.count_nonzero(kept))
            if not count:
                continue
            if stayed is None:
                old = at[done : done + count]
                done += count
            else:
                old, done = next_set(stayed, done, count)
            ij = keys[block][kept]
            i, j = (ij // n).astype(np.int32), (ij % n).astype(np.int32)
            del ij
            corr = np.exp(-(moved[i] + moved[j]) / decorrelation)
            fresh = shadow[block]
            fresh[kept] = corr * s.shadow[old] + np.sqrt(1.0 - corr**2) * fresh[kept]
            del corr
            los[block][kept] = s.los_draw[old]
            v = speeds[i] + speeds[j] + env
            del i, j
            # float32, as ar1_step takes it; both directions share it.
            rho = fad.doppler_correlation(radio.doppler_hz(v, self.frequency_hz), dt)
            rho = rho.astype(np.float32)
            scale = fad.ar1_scale(rho)
            for side, part in ((0, 0), (0, 1), (1, 0), (1, 1)):
                fresh = scatter[side, part, block]
                fresh[kept] = fad.ar1_step(s.scatter[side, part, old], rho, fresh[kept], scale)
        s.shadow = s.los_draw = s.scatter = np.zeros(0, dtype=np.float32)  # used up
        burst = None
        if self.gilbert is not None and s.burst is not None:
            if stayed is not None:
                at = np.flatnonzero(stayed)
            u = np.stack([d.uniform(BURST, step, keys), d.uniform(BURST, step, reverse, 1)], 1)
            burst = self.gilbert.initial(u)
            burst[found] = self.gilbert.step(s.burst[at], u[found])
        return _Pairs(mob, keys, distance, near, shadow, los, scatter, burst)

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
