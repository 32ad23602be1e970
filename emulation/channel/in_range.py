"""The node pairs in range and their channel processes, step by step: what the model over the
links in range (:mod:`airgossip.emulation.channel.sparse`) computes its links from.

The pairs within :attr:`InRangeChannel.range_m` of each other are found each step (a k-d tree,
or a scan of every pair where most are in range); shadowing, line of sight and fast fading are
held per pair in range and continued while it stays in range. A pair that comes into range
starts from a fresh draw of its stationary distribution.

``range_m`` is the distance past which path loss leaves a link below the sensitivity even
with shadowing :data:`SHADOW_MARGIN` standard deviations in its favour (where line of sight
is drawn per pair: non line of sight, and line of sight while its probability is at least
:data:`LOS_CUTOFF`); links beyond it (a rare line-of-sight pair far away, a deeper shadowing
tail) are not modelled, nor is the interference of transmitters beyond it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree

from airgossip.emulation.channel import fading as fad
from airgossip.emulation.channel import radio
from airgossip.emulation.channel.base import BURST, FADING, LOS, MOBILITY, SHADOW, ChannelBase
from airgossip.emulation.channel.draws import DenseDraws, Draws, StreamDraws
from airgossip.emulation.channel.heap import keep_block_temporaries
from airgossip.emulation.channel.mobility import MobilityState
from airgossip.emulation.channel.pairs import BLOCK_PAIRS, next_set, pair_distances, scan_rows
from airgossip.scenario.wireless import WirelessSettings

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


class InRangeChannel(ChannelBase):
    """The pairs of ``n`` nodes in range and their processes over time; a subclass computes
    each step's links from them (:meth:`_next` gives the pairs of a step).

    ``dense_draws``: draw as the dense model does (whole ``n x n`` arrays). ``range_m``: the
    range (by default where the strongest sender falls below the weakest receiver's
    sensitivity, see the module).
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
