"""The dense channel model: all ``n x n`` directed links, one time step at a time.

A step computes, for every directed link at once (numpy, float32, a block of rows at a time):

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

Each link owns fixed positions in the draw arrays. Large fleets use the model over the links
in range (:mod:`airgossip.emulation.channel.sparse`); :func:`channel_model` picks one.
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass

import numpy as np

from airgossip.emulation.channel import fading as fad
from airgossip.emulation.channel import radio
from airgossip.emulation.channel.ahead import StepsAhead, WorkerGone
from airgossip.emulation.channel.base import (
    ACTIVE,
    BURST,
    CACHE_BYTES,
    FADING,
    LINK_STATE_BYTES,
    LOS,
    MOBILITY,
    SHADOW,
    ChannelBase,
)
from airgossip.emulation.channel.graph import gossip_adjacency, strongly_connected
from airgossip.emulation.channel.mobility import MobilityState
from airgossip.emulation.channel.state import AnyLinkState, LinkState, SparseLinkState
from airgossip.scenario.wireless import WirelessSettings

__all__ = [
    "ACTIVE", "CACHE_BYTES", "LINK_STATE_BYTES", "AnyLinkState", "ChannelBase", "ChannelModel",
    "LinkState", "SparseLinkState", "channel_model", "gossip_adjacency", "strongly_connected",
]  # fmt: skip

#: Elements of the n x n arrays computed at once (a block of rows): bounds a step's temporaries.
BLOCK_ELEMENTS = 1 << 22

#: Above this many nodes :func:`channel_model` gives the model over the links in range.
DENSE_MAX_NODES = 2000

#: From this many nodes a dense model's steps are worth a process of their own
#: (:meth:`ChannelModel.compute_ahead`): a step of 500 nodes is about 60 ms of NumPy.
AHEAD_MIN_NODES = 500

log = logging.getLogger(__name__)


@dataclass
class _Internal:
    mobility: MobilityState
    shadow: np.ndarray  # unit-variance shadowing per unordered pair, symmetric
    los_draw: np.ndarray  # uniform per unordered pair: LOS while below P_LOS(d)
    scatter: np.ndarray  # complex64 fading per directed link
    burst: np.ndarray | None  # Gilbert-Elliott states when given


def symmetric(values: np.ndarray) -> np.ndarray:
    upper = np.triu(values, 1)
    return np.asarray(upper + upper.T)


def channel_model(
    settings: WirelessSettings, n: int, seed: int, *, dense: bool | None = None
) -> ChannelBase:
    """The channel model for ``n`` nodes: dense up to :data:`DENSE_MAX_NODES` nodes (and where
    ``dense``), over the links in range above."""
    if dense is None:
        dense = n <= DENSE_MAX_NODES
    if dense:
        return ChannelModel(settings, n, seed)
    from airgossip.emulation.channel.sparse import SparseChannelModel

    return SparseChannelModel(settings, n, seed)


class ChannelModel(ChannelBase):
    """Per directed link channel state over time for ``n`` nodes, all ``n x n`` links
    (parameters as :class:`~airgossip.emulation.channel.base.ChannelBase`'s)."""

    def __init__(
        self, settings: WirelessSettings, n: int, seed: int, cache_steps: int | None = None
    ) -> None:
        self._internal: _Internal | None = None
        self._ahead: StepsAhead | None = None
        super().__init__(settings, n, seed, cache_steps)

    def compute_ahead(self) -> bool:
        """Have the steps after step 0 computed in a worker process, each while the caller
        works in the one before (:mod:`airgossip.emulation.channel.ahead`; the same arrays), where
        that pays: :data:`AHEAD_MIN_NODES` nodes or more and a second CPU for this process.
        Whether it does. The worker ends with the model, or at :meth:`close`."""
        if self._ahead is None:
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
            if self.n < AHEAD_MIN_NODES or cpus < 2 or not hasattr(os, "memfd_create"):
                return False  # (memory files: Linux)
            self._ahead = StepsAhead(self.settings, self.n, self.seed, first=1)
            weakref.finalize(self, self._ahead.close)
        return True

    def close(self) -> None:
        """Stop the worker of :meth:`compute_ahead`, if any (steps are computed here again)."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def _restart(self) -> None:
        self._internal = None

    # -- one step ----------------------------------------------------------------------------
    def _advance(self, step: int) -> LinkState:
        if self._ahead is not None and step > 0:
            try:
                state = self._ahead.take(step)
                self._internal = None  # the worker carries the sequence on
                return state
            except WorkerGone as err:
                log.warning("%s; the channel model's steps are computed in this process", err)
                self._ahead = None
        if self._internal is None and step > 0:  # after the worker: the steps before again
            for k in range(step):
                self._internal = self._next_internal(k)
        # The next internal state first, so that its temporaries are freed before the link
        # state (the larger part) is computed.
        self._internal = self._next_internal(step)
        return self._link_state(step)

    def _next_internal(self, step: int) -> _Internal:
        n, dt = self.n, self.step_s
        mob_rng = self._rng(MOBILITY, step)
        if self._internal is None:
            mob = self.mobility.initial(n, mob_rng)
            shadow = symmetric(self._rng(SHADOW, 0).standard_normal((n, n), dtype=np.float32))
            los = symmetric(self._rng(LOS, 0).random((n, n), dtype=np.float32))
            scatter = fad.complex_normal(self._rng(FADING, 0), (n, n))
            burst = None
            if self.gilbert is not None:
                burst = self.gilbert.initial(self._rng(BURST, 0).random((n, n), dtype=np.float32))
            return _Internal(mob, shadow, los, scatter, burst)
        s = self._internal
        before = s.mobility.positions
        mob = self.mobility.step(s.mobility, dt, mob_rng)
        moved = np.linalg.norm(mob.positions - before, axis=1).astype(np.float32)
        corr = np.exp(-(moved[:, None] + moved[None, :]) / np.float32(self.decorrelation_m))
        fresh = symmetric(self._rng(SHADOW, step).standard_normal((n, n), dtype=np.float32))
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
        scatter = fad.ar1_step(s.scatter, rho, fad.complex_normal(self._rng(FADING, step), (n, n)))
        del rho
        burst = s.burst
        if self.gilbert is not None and burst is not None:
            burst = self.gilbert.step(
                burst, self._rng(BURST, step).random((n, n), dtype=np.float32)
            )
        return _Internal(mob, shadow.astype(np.float32), s.los_draw, scatter, burst)

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
            loss, sigma = self._path_loss(d, s.los_draw[rows], rows, slice(None))
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
        active = self._active(step)
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
        trace_values = self._trace_values(t)
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
            masks = [mask[rows] for _, mask in self.trace_links]
            index, sinr_rows, rate[rows], per[rows], residual[rows], goodput[rows] = self._figures(
                sinr_lin, masks, trace_values
            )
            del sinr_lin
            sinr_rows[diagonal] = -np.inf
            sinr_db[rows] = sinr_rows
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
            del index, sinr_rows
        loss_good, loss_bad = self._loss_states()
        np.fill_diagonal(exists, False)
        return LinkState(
            step=step, time_s=t, positions=pos.copy(), speeds=s.mobility.speeds.copy(),
            distance_m=distance, rx_dbm=rx, exists=exists, sinr_db=sinr_db, rate_bps=rate,
            per=per, residual=residual, bad=bad, goodput_bps=goodput, hears=hears,
            latency_s=latency, loss_good=loss_good, loss_bad=loss_bad,
        )  # fmt: skip
