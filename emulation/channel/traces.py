"""Rate traces: Mahimahi delivery files and two-column ``time Mbps`` files.

A trace turns into a function of time giving the link rate in bit/s averaged over one
model step; traces loop when the run outlasts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Mahimahi: each line is one opportunity to deliver an MTU-sized packet.
MAHIMAHI_PACKET_BYTES = 1500


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and the line."""


@dataclass(frozen=True)
class RateTrace:
    """A piecewise-constant rate: ``rates_bps[i]`` holds from ``times_s[i]`` on; loops at
    ``period_s``."""

    times_s: np.ndarray
    rates_bps: np.ndarray
    period_s: float

    def mean_rate(self, start_s: float, duration_s: float) -> float:
        """Average rate over ``[start, start + duration)`` (looping), in bit/s."""
        if duration_s <= 0:
            return self.rate_at(start_s)
        edges = np.append(self.times_s, self.period_s)
        total, t, end = 0.0, start_s, start_s + duration_s
        while t < end - 1e-12:
            local = t % self.period_s
            i = int(np.searchsorted(self.times_s, local, side="right") - 1)
            seg_end = edges[i + 1] - local
            span = min(seg_end, end - t)
            total += self.rates_bps[i] * span
            t += max(span, 1e-9)
        return total / duration_s

    def rate_at(self, t: float) -> float:
        local = t % self.period_s
        return float(self.rates_bps[int(np.searchsorted(self.times_s, local, side="right") - 1)])


def read_mahimahi(path: Path, bin_ms: int = 100) -> RateTrace:
    """A Mahimahi trace: integer millisecond timestamps, one per 1500-byte delivery chance.

    Rates are counted per ``bin_ms`` bin; the trace loops after its last timestamp (a file
    holding just ``1`` is 12 Mbit/s).
    """
    stamps: list[int] = []
    for number, line in enumerate(_lines(path), 1):
        text = line.strip()
        if not text:
            continue
        try:
            value = int(text)
        except ValueError:
            raise TraceError(
                f"{path}:{number}: expected an integer millisecond, got {text!r}"
            ) from None
        if value < 0 or (stamps and value < stamps[-1]):
            raise TraceError(f"{path}:{number}: timestamps must be non-negative and non-decreasing")
        stamps.append(value)
    if not stamps:
        raise TraceError(f"{path}: no timestamps")
    period_ms = max(stamps[-1], 1)
    bins = max(1, -(-period_ms // bin_ms))
    # Timestamp t (1-based ms) delivers during millisecond t - 1.
    counts = np.bincount((np.asarray(stamps) - 1).clip(0) // bin_ms, minlength=bins)[:bins]
    widths = np.full(bins, bin_ms / 1000.0)
    widths[-1] = (period_ms - (bins - 1) * bin_ms) / 1000.0
    rates = counts * MAHIMAHI_PACKET_BYTES * 8.0 / widths
    return RateTrace(np.arange(bins) * bin_ms / 1000.0, rates, period_ms / 1000.0)


def read_mbps(path: Path) -> RateTrace:
    """Two columns ``time_s Mbps`` (Pensieve's "cooked" format); each rate holds until the
    next time; the trace loops after the last row (whose rate holds for the mean gap)."""
    times: list[float] = []
    rates: list[float] = []
    for number, line in enumerate(_lines(path), 1):
        fields = line.replace(",", " ").split()
        if not fields or fields[0].startswith("#"):
            continue
        try:
            t, mbps = float(fields[0]), float(fields[1])
        except (ValueError, IndexError):
            raise TraceError(
                f"{path}:{number}: expected 'time_s Mbps', got {line.strip()!r}"
            ) from None
        if mbps < 0 or (times and t <= times[-1]):
            raise TraceError(f"{path}:{number}: times must increase and rates be non-negative")
        times.append(t)
        rates.append(mbps * 1e6)
    if not times:
        raise TraceError(f"{path}: no rows")
    t0 = times[0]
    rel = np.asarray(times) - t0
    gap = float(np.mean(np.diff(rel))) if len(rel) > 1 else 1.0
    return RateTrace(rel, np.asarray(rates), float(rel[-1] + gap))


def read_trace(path: Path, fmt: str) -> RateTrace:
    """Read a trace of format ``mahimahi`` or ``mbps``."""
    if fmt == "mahimahi":
        return read_mahimahi(path)
    if fmt == "mbps":
        return read_mbps(path)
    raise TraceError(f"unknown trace format '{fmt}'; choose one of: mahimahi, mbps")


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError as err:
        raise TraceError(f"cannot read trace {path}: {err.strerror}") from None
