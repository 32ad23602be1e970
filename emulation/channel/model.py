"""The channel model: every directed link's state, one time step at a time, from one seed.

A step computes, for all ``n x n`` directed links at once (numpy, float32):

* mean received power ``P_tx + G - PL(d) - sigma S``: path loss (log-distance or 3GPP
  38.901 with line-of-sight drawn per node pair) and shadowing ``S``, correlated over
  distance moved and the same both ways (it belongs to the unordered pair);
* whether the link exists: mean received power >= the lowest rate's sensitivity;
* instantaneous SINR: fast fading (Rayleigh or Rician, AR(1) in time with
  ``J0(2 pi f_D dt)``), noise ``-174 + 10 log10 B + NF`` and interference from nodes the
  sender cannot hear (carrier sense) weighted by how often they transmit;
* rate from the 802.11 MCS table or the LTE CQI table (or a trace), packet errors from the
  modulation and packet length, the residual loss after link-layer retries, and the burst
  state (fading-driven or a Gilbert-Elliott chain).

Random draws are keyed by ``(seed, stream, step)`` and each link owns fixed positions in
the draw arrays, so the state at step ``k`` is a function of the seed, the scenario and
``k`` alone. Steps are computed in order and the most recent ones are cached.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from emulation.channel import fading as fad
from emulation.channel import radio
from emulation.channel.bursts import GilbertElliottLoss
from emulation.channel.mobility import (
    GaussMarkov,
    Mobility,
    MobilityState,
    RandomWaypoint,
    StaticMobility,
)
from emulation.channel.traces import RateTrace, read_trace
from emulation.scenario import WirelessSettings

#: Bytes per directed link of one computed step (the n x n arrays of a LinkState).
LINK_STATE_BYTES = 35
#: What the cache of computed steps may hold by default: eight steps of a 1,000-node fleet
#: (35 MB each), the minimum of two of a 10,000-node one (3.5 GB each). An evicted step is
#: recomputed from step 0 when asked again (the same values, slowly); the drivers ask in time
#: order, looking ahead only as long as a message is on the air.
CACHE_BYTES = 1 << 29

#: Elements of the n x n arrays computed at once (a block of rows): bounds a step's temporaries.
BLOCK_ELEMENTS = 1 << 22

# Streams of random draws (the second key of every generator).
_MOBILITY, _SHADOW, _LOS, _FADING, _BURST, _ACTIVE = 1, 2, 3, 4, 5, 6


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

    def chunk_loss(self, i: int, j: int, nbytes: int, packet_bytes: int) -> float:
        """Probability that a chunk of ``nbytes`` started on link i->j in this step is lost."""
        if not self.exists[i, j]:
            return 1.0
        state_loss = self.loss_bad if self.bad[i, j] else self.loss_good
        packets = max(1, -(-nbytes // packet_bytes))
        survive = (1.0 - state_loss) * (1.0 - float(self.residual[i, j])) ** packets
        return 1.0 - survive


@dataclass
class _Internal:
    mobility: MobilityState
    shadow: np.ndarray  # unit-variance shadowing per unordered pair, symmetric
    los_draw: np.ndarray  # uniform per unordered pair: LOS while below P_LOS(d)
    scatter: np.ndarray  # complex64 fading per directed link
    burst: np.ndarray | None  # Gilbert-Elliott states when given


def _symmetric(values: np.ndarray) -> np.ndarray:
    upper = np.triu(values, 1)
    return np.asarray(upper + upper.T)


class ChannelModel:
    """Per directed link channel state over time for ``n`` nodes.

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
        self._cache: OrderedDict[int, LinkState] = OrderedDict()
        if cache_steps is None:
            cache_steps = min(8, CACHE_BYTES // max(1, LINK_STATE_BYTES * n * n))
        self._cache_steps = max(2, cache_steps)
        self._internal: _Internal | None = None
        self._cursor = -1
        self._lock = threading.RLock()  # shapers and graph builders share one model

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

    def at(self, time_s: float) -> LinkState:
        return self.state(self.step_of(time_s))

    def state(self, step: int) -> LinkState:
        """The link state of step ``step`` (computing the steps before it if needed)."""
        with self._lock:
            return self._state(step)

    def _state(self, step: int) -> LinkState:
        cached = self._cache.get(step)
        if cached is not None:
            self._cache.move_to_end(step)
            return cached
        if step <= self._cursor:  # older than the cache: replay from the start
            self._internal, self._cursor = None, -1
        result: LinkState | None = None
        while self._cursor < step:
            self._cursor += 1
            # Make room first: the evicted step's arrays are freed before the new ones exist.
            while len(self._cache) >= self._cache_steps:
                self._cache.popitem(last=False)
            result = self._advance(self._cursor)
            self._cache[self._cursor] = result
        assert result is not None
        return result

    # -- one step ----------------------------------------------------------------------------
    def _advance(self, step: int) -> LinkState:
        # The next internal state first, so that its temporaries are freed before the link
        # state (the larger part) is computed.
        self._internal = self._next_internal(step)
        return self._link_state(step)

    def _next_internal(self, step: int) -> _Internal:
        n, dt = self.n, self.step_s
        mob_rng = self._rng(_MOBILITY, step)
        if self._internal is None:
            mob = self.mobility.initial(n, mob_rng)
            shadow = _symmetric(self._rng(_SHADOW, 0).standard_normal((n, n), dtype=np.float32))
            los = _symmetric(self._rng(_LOS, 0).random((n, n), dtype=np.float32))
            scatter = fad.complex_normal(self._rng(_FADING, 0), (n, n))
            burst = None
            if self.gilbert is not None:
                burst = self.gilbert.initial(self._rng(_BURST, 0).random((n, n), dtype=np.float32))
            return _Internal(mob, shadow, los, scatter, burst)
        s = self._internal
        before = s.mobility.positions
        mob = self.mobility.step(s.mobility, dt, mob_rng)
        moved = np.linalg.norm(mob.positions - before, axis=1).astype(np.float32)
        corr = np.exp(-(moved[:, None] + moved[None, :]) / np.float32(self.decorrelation_m))
        fresh = _symmetric(self._rng(_SHADOW, step).standard_normal((n, n), dtype=np.float32))
        shadow = corr * s.shadow + np.sqrt(1.0 - corr**2) * fresh
        del corr, fresh
        speeds = mob.speeds.astype(np.float32)
        v = (
            speeds[:, None]
            + speeds[None, :]
            + np.float32(self.settings.fading.environment_speed_mps)
        )
        rho = fad.doppler_correlation(radio.doppler_hz(v, self.frequency_hz), dt)
        del v
        scatter = fad.ar1_step(s.scatter, rho, fad.complex_normal(self._rng(_FADING, step), (n, n)))
        del rho
        burst = s.burst
        if self.gilbert is not None and burst is not None:
            burst = self.gilbert.step(
                burst, self._rng(_BURST, step).random((n, n), dtype=np.float32)
            )
        return _Internal(mob, shadow.astype(np.float32), s.los_draw, scatter, burst)

    def _path_loss(
        self, distance: np.ndarray, rows: slice = slice(None)
    ) -> tuple[np.ndarray, np.ndarray]:
        """Path loss and shadowing sigma per link (of the links in ``rows``)."""
        pl = self.settings.path_loss
        f = self.frequency_hz
        if pl.model == "log-distance":
            return radio.log_distance_loss_db(distance, f, pl.exponent), np.float32(
                self.shadow_sigma_db
            )
        if pl.model == "free-space":
            return radio.log_distance_loss_db(distance, f, 2.0), np.float32(self.shadow_sigma_db)
        if not self._mixed_los:
            return radio.path_loss_38901_db(pl.model, distance, f), np.float32(self.shadow_sigma_db)
        assert self._internal is not None
        los = self._internal.los_draw[rows] < radio.los_probability(pl.model, distance)
        loss = np.where(
            los,
            radio.path_loss_38901_db(f"{pl.model}-los", distance, f),
            radio.path_loss_38901_db(f"{pl.model}-nlos", distance, f),
        )
        sigma_los = radio.PATH_LOSS_38901[f"{pl.model}-los"][3]
        sigma = np.where(los, sigma_los, self.shadow_sigma_db)
        if pl.shadowing_db is not None:
            sigma = np.full_like(sigma, pl.shadowing_db)
        return loss, sigma

    def _blocks(self) -> list[slice]:
        """Row blocks of the n x n arrays: every quantity of a link is element-wise in its
        row but for the few transposes and sums over transmitters, so a step is computed a
        block of rows at a time and its float64 temporaries stay the size of one block."""
        rows = max(1, BLOCK_ELEMENTS // max(1, self.n))
        return [slice(r, min(r + rows, self.n)) for r in range(0, self.n, rows)]

    def _link_state(self, step: int) -> LinkState:
        s = self._internal
        assert s is not None
        cfg, n = self.settings, self.n
        pos = s.mobility.positions
        blocks = self._blocks()
        distance = np.empty((n, n), dtype=np.float32)
        rx = np.empty((n, n), dtype=np.float32)
        exists = np.empty((n, n), dtype=bool)
        for rows in blocks:
            diagonal = (np.arange(rows.stop - rows.start), np.arange(rows.start, rows.stop))
            d = np.sqrt(((pos[rows, None, :] - pos[None, :, :]) ** 2).sum(-1)).astype(np.float32)
            distance[rows] = d
            loss, sigma = self._path_loss(d, rows)
            rx_rows = (
                self.tx_dbm[rows, None] + np.float32(cfg.antenna_gain_dbi) - loss
                - sigma * s.shadow[rows]
            ).astype(np.float32)  # fmt: skip
            rx_rows[diagonal] = -np.inf
            rx[rows] = rx_rows
            exists[rows] = rx_rows >= self.sensitivity_dbm[None, :]
            del d, loss, sigma, rx_rows
        carrier_sense = cfg.carrier_sense
        # hears[i, k]: node i hears node k (k's power at i) above the carrier-sense level;
        # under scheduled access, "hears" means "is in range of" (for the shared air).
        hears = np.float32(carrier_sense) <= rx.T if carrier_sense is not None else exists.T.copy()
        np.fill_diagonal(hears, True)
        noise_mw = np.power(10.0, self.noise_dbm / 10.0).astype(np.float32)
        # The concurrent transmitters of this step: each node is on the air with probability
        # `activity`. Under CSMA the ones the sender hears defer to it, so only hidden nodes
        # interfere; under scheduled access every active node does.
        active = np.zeros(0, dtype=np.int64)
        if cfg.activity > 0 and n > 2:
            active = np.flatnonzero(self._rng(_ACTIVE, step).random(n) < cfg.activity)
        heard: np.ndarray | None = None
        total = np.zeros(n, dtype=np.float32)
        if active.size:
            a = np.power(np.float32(10.0), rx[active] / np.float32(10.0))  # [k, j]: k's power at j
            total = a.sum(axis=0)
            if carrier_sense is not None:
                heard = hears[:, active].astype(np.float32) @ a
            del a
        is_active = np.zeros(n, dtype=bool)
        is_active[active] = True
        rate = np.empty((n, n), dtype=np.float32)
        per = np.empty((n, n), dtype=np.float32)
        residual = np.empty((n, n), dtype=np.float32)
        goodput = np.empty((n, n), dtype=np.float32)
        sinr_db = np.empty((n, n), dtype=np.float32)
        bad = np.empty((n, n), dtype=bool)
        latency = np.empty((n, n), dtype=np.float32)
        t = step * self.step_s
        trace_values = [
            np.float32(trace.mean_rate(t, self.step_s)) for trace, _ in self.trace_links
        ]
        for rows in blocks:
            diagonal = (np.arange(rows.stop - rows.start), np.arange(rows.start, rows.stop))
            rx_mw = np.power(np.float32(10.0), rx[rows] / np.float32(10.0))  # 0 on the diagonal
            interference = np.zeros(rx_mw.shape, dtype=np.float32)
            if active.size:
                if heard is not None:
                    interference = total[None, :] - heard[rows]
                else:
                    interference = total[None, :] - np.where(
                        is_active[rows, None], rx_mw, 0.0
                    ).astype(np.float32)
                interference = np.maximum(interference, 0.0).astype(np.float32)
            gain = (
                fad.power_gain(s.scatter[rows], self.k_factor)
                if cfg.fading.model != "none"
                else 1.0
            )
            sinr_lin = rx_mw * gain / (noise_mw[None, :] + interference)
            del rx_mw, interference, gain
            sinr_rows = radio.linear_to_db(sinr_lin).astype(np.float32)
            sinr_rows[diagonal] = -np.inf
            sinr_db[rows] = sinr_rows
            index = self.table.index(sinr_rows)
            del sinr_rows
            rate_rows = np.where(
                index >= 0, self.table.rates_bps[np.maximum(index, 0)], 0.0
            ).astype(np.float32)
            per_rows = np.ones(rate_rows.shape, dtype=np.float32)
            if self.table.name == "lte":
                per_rows = np.where(index >= 0, radio.block_error_shortcut(sinr_lin), 1.0).astype(
                    np.float32
                )
            else:
                for bits in sorted(set(self.table.bits_per_symbol)):
                    levels = [k for k, b in enumerate(self.table.bits_per_symbol) if b == bits]
                    mask = np.isin(index, levels)
                    if mask.any():
                        ber = radio.bit_error_rate(sinr_lin[mask], bits)
                        per_rows[mask] = radio.packet_error_rate(ber, cfg.packet_bytes)
            del sinr_lin
            residual[rows] = np.power(per_rows, cfg.retries + 1, dtype=np.float32)
            goodput_rows = (rate_rows * np.float32(cfg.mac_efficiency) * (1.0 - per_rows)).astype(
                np.float32
            )
            for (_, mask), value in zip(self.trace_links, trace_values, strict=True):
                rate_rows = np.where(mask[rows], value, rate_rows)
                goodput_rows = np.where(mask[rows], value, goodput_rows)
            rate[rows], per[rows], goodput[rows] = rate_rows, per_rows, goodput_rows
            if self.gilbert is not None and s.burst is not None:
                bad[rows] = s.burst[rows] & exists[rows]
            elif cfg.burst.model == "fading":
                bad[rows] = exists[rows] & (index < 0)
            else:
                bad[rows] = False
            latency[rows] = (
                np.float32(cfg.latency_ms / 1000.0)
                + distance[rows] / np.float32(radio.SPEED_OF_LIGHT)
            ).astype(np.float32)
            del index, rate_rows, per_rows, goodput_rows
        if self.gilbert is not None and s.burst is not None:
            loss_good, loss_bad = self.gilbert.loss_good, self.gilbert.loss_bad
        else:
            loss_good, loss_bad = 0.0, 1.0
        np.fill_diagonal(exists, False)
        return LinkState(
            step=step, time_s=t, positions=pos.copy(), speeds=s.mobility.speeds.copy(),
            distance_m=distance, rx_dbm=rx, exists=exists, sinr_db=sinr_db, rate_bps=rate,
            per=per, residual=residual, bad=bad, goodput_bps=goodput, hears=hears,
            latency_s=latency, loss_good=loss_good, loss_bad=loss_bad,
        )  # fmt: skip


def gossip_adjacency(
    state: LinkState,
    max_out_degree: int,
    margin_db: float = 0.0,
    sensitivity_dbm: np.ndarray | None = None,
) -> np.ndarray:
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


def _components(adjacency: np.ndarray) -> tuple[int, np.ndarray]:
    count, labels = connected_components(csr_matrix(adjacency), directed=True, connection="strong")
    return int(count), labels


def strongly_connected(adjacency: np.ndarray) -> tuple[bool, int]:
    """Whether a directed graph is strongly connected, and its number of strong components."""
    count, _ = _components(adjacency)
    return count == 1, count
