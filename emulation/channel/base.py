"""What every channel model shares: the radio set-up from the ``[wireless]`` table, the time
steps, the cache of computed steps, path loss and the per-link figures that follow from a
link's SINR (rate, packet errors, goodput).

Random draws are keyed by ``(seed, stream, step)``; the state at step ``k`` is a function of
the seed, the scenario and ``k`` alone. Steps are computed in order and the most recent ones
are cached.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np

from airgossip.emulation.channel import radio
from airgossip.emulation.channel.bursts import GilbertElliottLoss
from airgossip.emulation.channel.mobility import (
    GaussMarkov,
    Mobility,
    RandomWaypoint,
    StaticMobility,
)
from airgossip.emulation.channel.state import AnyLinkState
from airgossip.emulation.channel.traces import RateTrace, read_trace
from airgossip.scenario.wireless import WirelessSettings

#: Bytes per directed link of one computed step (the arrays of a link state).
LINK_STATE_BYTES = 35
#: What the cache of computed steps may hold by default: eight steps of a 1,000-node fleet
#: (35 MB each), the minimum of two of a 10,000-node dense one (3.5 GB each). An evicted step
#: is recomputed from step 0 when asked again (the same values, slowly); the drivers ask in
#: time order, looking ahead only as long as a message is on the air.
CACHE_BYTES = 1 << 29

# Streams of random draws (the second key of every generator).
MOBILITY, SHADOW, LOS, FADING, BURST, ACTIVE = 1, 2, 3, 4, 5, 6


class ChannelBase:
    """What every channel model of ``n`` nodes shares: the radio set-up, the clock of steps
    and the cache of computed steps (a subclass computes one step in :meth:`_advance`).

    Parameters
    ----------
    settings:
        The ``[wireless]`` table.
    n:
        Number of nodes (agents), node ``i`` being agent ``i``.
    seed:
        Root of every draw.
    cache_steps:
        How many computed steps to keep (at least 2); by default as many as fit in
        :data:`CACHE_BYTES`, at most 8.
    """

    def __init__(
        self, settings: WirelessSettings, n: int, seed: int, cache_steps: int | None = None
    ) -> None:
        self.settings = settings
        self.n = n
        self.seed = seed
        self.step_s = settings.step_s
        self.frequency_hz = settings.frequency_ghz * 1e9
        self.bandwidth_hz = settings.bandwidth_mhz * 1e6
        self.tx_dbm = np.asarray(settings.per_node("tx_power_dbm", n), dtype=np.float32)
        nf = np.asarray(settings.per_node("noise_figure_db", n), dtype=np.float64)
        self.noise_dbm = np.array([radio.noise_floor_dbm(self.bandwidth_hz, f) for f in nf])
        if settings.radio == "wifi":
            self.table = radio.wifi_rate_table(
                int(settings.bandwidth_mhz), float(nf.mean()),
                streams=settings.streams, max_mcs=settings.max_mcs,
            )  # fmt: skip
        else:
            self.table = radio.lte_rate_table(self.bandwidth_hz)
        #: Received power a node needs for the lowest rate (dBm), per receiver.
        self.sensitivity_dbm = (self.noise_dbm + self.table.min_sinr_db).astype(np.float32)
        self.mobility = self._mobility()
        #: Antenna height of each node (m); ``uniform_height_m``: the one height all share,
        #: or None (then path loss takes each link's two heights).
        self.height_m = np.asarray(settings.per_node("antenna_height_m", n), dtype=np.float64)
        self.uniform_height_m: float | None = (
            float(self.height_m[0]) if n and np.all(self.height_m == self.height_m[0]) else None
        )
        pl = settings.path_loss
        family = pl.model.split("-")[0]
        self._mixed_los = pl.model in ("umi", "uma", "inh")
        if pl.model in ("log-distance", "free-space"):
            default_sigma, default_corr = 6.0, 10.0
        elif self._mixed_los:
            default_sigma = radio.PATH_LOSS_38901[f"{family}-nlos"][3]
            default_corr = radio.DECORRELATION_38901[f"{family}-nlos"]
        else:
            default_sigma, default_corr = (
                radio.PATH_LOSS_38901[pl.model][3],
                radio.DECORRELATION_38901[pl.model],
            )
        self.shadow_sigma_db = default_sigma if pl.shadowing_db is None else pl.shadowing_db
        self.decorrelation_m = pl.decorrelation_m or default_corr
        fd = settings.fading
        self.k_factor = None if fd.model != "rician" else 10.0 ** (fd.k_factor_db / 10.0)
        burst = settings.burst
        self.gilbert = (
            GilbertElliottLoss(burst.p, burst.r, burst.loss_good, burst.loss_bad)
            if burst.model == "gilbert-elliott"
            else None
        )
        self.trace_links = self._traces()
        self._cache: OrderedDict[int, AnyLinkState] = OrderedDict()
        if cache_steps is None:
            cache_steps = min(8, CACHE_BYTES // max(1, LINK_STATE_BYTES * self._links_estimate()))
        self._cache_steps = max(2, cache_steps)
        self._cursor = -1
        self._lock = threading.RLock()  # shapers and graph builders share one model
        # The latest step a gossip graph epoch starts at, kept past the cache until the graph
        # asks for it (:meth:`graph_state`).
        self._epoch_start: tuple[int, AnyLinkState] | None = None

    # -- set-up ------------------------------------------------------------------------------
    def _mobility(self) -> Mobility:
        m = self.settings.mobility
        area = (float(m.area_m[0]), float(m.area_m[1]))
        if m.model == "random-waypoint":
            return RandomWaypoint(area, m.min_speed_mps, m.max_speed_mps, m.pause_s)
        if m.model == "gauss-markov":
            return GaussMarkov(area, m.mean_speed_mps, m.speed_sigma_mps, m.memory)
        positions = None
        if m.positions is not None:
            if len(m.positions) != self.n:
                raise ValueError(
                    f"wireless.mobility.positions lists {len(m.positions)} positions for "
                    f"{self.n} agents"
                )
            positions = np.asarray(m.positions, dtype=np.float64)
        return StaticMobility(area, positions)

    def _traces(self) -> list[tuple[RateTrace, np.ndarray]]:
        out = []
        for entry in self.settings.traces:
            trace = read_trace(entry.file, entry.format)
            mask = np.zeros((self.n, self.n), dtype=bool)
            if entry.links == "all":
                mask[:] = True
                np.fill_diagonal(mask, False)
            else:
                for i, j in entry.links:
                    if not (0 <= i < self.n and 0 <= j < self.n) or i == j:
                        raise ValueError(
                            f"trace {entry.file}: link [{i}, {j}] is not a link between two of "
                            f"the {self.n} agents"
                        )
                    mask[i, j] = True
            out.append((trace, mask))
        return out

    def _rng(self, stream: int, step: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, stream, step])

    # -- time ----------------------------------------------------------------------------------
    def step_of(self, time_s: float) -> int:
        step = math.floor(time_s / self.step_s + 1e-9)
        return step if step > 0 else 0

    def at(self, time_s: float) -> AnyLinkState:
        return self.state(self.step_of(time_s))

    def state(self, step: int) -> AnyLinkState:
        """The link state of step ``step`` (computing the steps before it if needed)."""
        with self._lock:
            return self._state(step)

    def graph_state(self, time_s: float) -> AnyLinkState:
        """The state the gossip graph epoch starting at ``time_s`` is built from.

        The event loop builds an epoch's graph when it reaches the epoch's start, while the
        shaper may have had later steps computed for transfers that stall into them (five
        at lte-urban's 1 s steps): the step is kept from when it is computed until asked for
        here, so a cache of two steps does not replay the run from step 0 for it (at 10,000
        nodes in lte-urban's 2 km square, six steps of 17 s each)."""
        step = self.step_of(time_s)
        with self._lock:
            kept = self._epoch_start
            if kept is not None and kept[0] == step:
                self._epoch_start = None
                return kept[1]
            state = self._state(step)
            if self._epoch_start is not None and self._epoch_start[0] == step:
                self._epoch_start = None  # asked for as it is computed: the cache has it
            return state

    def _starts_epoch(self, step: int) -> bool:
        interval = self.settings.graph_interval_s
        epoch = max(0, math.floor(step * self.step_s / interval + 1e-9))
        return self.step_of(epoch * interval) == step

    def _state(self, step: int) -> AnyLinkState:
        cached = self._cache.get(step)
        if cached is not None:
            self._cache.move_to_end(step)
            return cached
        if step <= self._cursor:  # older than the cache: replay from the start
            self._restart()
            self._cursor = -1
        result: AnyLinkState | None = None
        while self._cursor < step:
            self._cursor += 1
            # Make room first: the evicted step's arrays are freed before the new ones exist.
            while len(self._cache) >= self._cache_steps:
                self._cache.popitem(last=False)
            result = self._advance(self._cursor)
            self._cache[self._cursor] = result
            if self._starts_epoch(self._cursor):
                # Over the links in range only what the graph reads (a step is about 0.9 GB
                # at 10,000 nodes in lte-urban's square, and this one is kept past the cache).
                self._epoch_start = (self._cursor, result.for_graph())
        assert result is not None
        return result

    def compute_ahead(self) -> bool:
        """Have later steps computed in a worker process while the caller works in the
        step before, where the model can and that pays (the dense model's steps); whether it
        does. The model over the links in range does not: its steps are large and their
        hand-over would be a copy of them."""
        return False

    def close(self) -> None:
        """Stop what :meth:`compute_ahead` started."""

    # -- what a subclass provides ------------------------------------------------------------
    def _links_estimate(self) -> int:
        """How many directed links a step holds (sizes the cache)."""
        return self.n * self.n

    def _restart(self) -> None:
        """Forget the internal state: the next step computed is step 0."""
        raise NotImplementedError

    def _advance(self, step: int) -> AnyLinkState:
        raise NotImplementedError

    # -- shared physics ----------------------------------------------------------------------
    def _active(self, step: int) -> np.ndarray:
        """The concurrent transmitters of a step: each node is on the air with probability
        ``activity``."""
        if self.settings.activity > 0 and self.n > 2:
            return np.flatnonzero(self._rng(ACTIVE, step).random(self.n) < self.settings.activity)
        return np.zeros(0, dtype=np.int64)

    def _path_loss(
        self,
        distance: np.ndarray,
        los_draw: np.ndarray | None,
        senders: np.ndarray | slice | None = None,
        receivers: np.ndarray | slice | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Path loss and shadowing sigma per link (``distance``: 2D; ``los_draw``: the pairs'
        line-of-sight draws, for the models that mix line of sight and not; ``senders`` and
        ``receivers``: the links' ends, a row slice and all columns for the dense model's
        matrices, two index arrays for a list of links; needed unless heights are uniform)."""
        pl = self.settings.path_loss
        f = self.frequency_hz
        h_a, h_b = self._heights(senders, receivers)
        if pl.model in ("log-distance", "free-space"):
            if self.uniform_height_m is None:  # the 3D distance
                distance = np.sqrt(distance.astype(np.float64) ** 2 + (h_a - h_b) ** 2)
            exponent = pl.exponent if pl.model == "log-distance" else 2.0
            return radio.log_distance_loss_db(distance, f, exponent), np.float32(
                self.shadow_sigma_db
            )
        if not self._mixed_los:
            loss = radio.path_loss_38901_db(pl.model, distance, f, h_a, h_b)
            return loss, np.float32(self.shadow_sigma_db)
        assert los_draw is not None
        los = los_draw < radio.los_probability(pl.model, distance, np.minimum(h_a, h_b))
        loss = np.where(los, *radio.path_loss_38901_both_db(pl.model, distance, f, h_a, h_b))
        sigma_los = radio.PATH_LOSS_38901[f"{pl.model}-los"][3]
        sigma = np.where(los, sigma_los, self.shadow_sigma_db)
        if pl.shadowing_db is not None:
            sigma = np.full_like(sigma, pl.shadowing_db)
        return loss, sigma

    def _heights(
        self, senders: np.ndarray | slice | None, receivers: np.ndarray | slice | None
    ) -> tuple[np.ndarray | float, np.ndarray | float]:
        """The antenna heights of links' two ends, shaped to broadcast with their distances."""
        if self.uniform_height_m is not None:
            return self.uniform_height_m, self.uniform_height_m
        if senders is None or receivers is None:
            raise ValueError("links with antennas at different heights need their ends")
        if isinstance(senders, slice):  # rows of the dense matrices
            return self.height_m[senders, None], self.height_m[None, receivers]
        return self.height_m[senders], self.height_m[receivers]

    def _figures(
        self, sinr_lin: np.ndarray, trace_masks: list[np.ndarray], trace_values: list[np.float32]
    ) -> tuple[np.ndarray, ...]:
        """Rate index, SINR (dB), rate, packet errors, residual loss and goodput of links from
        their linear SINR (element-wise: any shape)."""
        cfg = self.settings
        sinr_db = radio.linear_to_db(sinr_lin).astype(np.float32)
        index = self.table.index(sinr_db)
        rate = np.where(index >= 0, self.table.rates_bps[np.maximum(index, 0)], 0.0).astype(
            np.float32
        )
        per = np.ones(rate.shape, dtype=np.float32)
        if self.table.name == "lte":
            per = np.where(index >= 0, radio.block_error_shortcut(sinr_lin), 1.0).astype(np.float32)
        else:
            for bits in sorted(set(self.table.bits_per_symbol)):
                levels = [k for k, b in enumerate(self.table.bits_per_symbol) if b == bits]
                mask = np.isin(index, levels)
                if mask.any():
                    ber = radio.bit_error_rate(sinr_lin[mask], bits)
                    per[mask] = radio.packet_error_rate(ber, cfg.packet_bytes)
        residual = np.power(per, cfg.retries + 1, dtype=np.float32)
        goodput = (rate * np.float32(cfg.mac_efficiency) * (1.0 - per)).astype(np.float32)
        for mask, value in zip(trace_masks, trace_values, strict=True):
            rate = np.where(mask, value, rate)
            goodput = np.where(mask, value, goodput)
        return index, sinr_db, rate, per, residual, goodput

    def _trace_values(self, t: float) -> list[np.float32]:
        return [np.float32(trace.mean_rate(t, self.step_s)) for trace, _ in self.trace_links]

    def _loss_states(self) -> tuple[float, float]:
        if self.gilbert is not None:
            return self.gilbert.loss_good, self.gilbert.loss_bad
        return 0.0, 1.0
