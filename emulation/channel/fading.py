"""Fast fading correlated in time, and the Bessel correlation that drives it.

Each directed link carries a complex gain ``h`` that evolves as a first-order autoregressive
process with ``rho = J0(2 pi f_D dt)`` (Jakes/Clarke), so consecutive steps of a slow link
are alike and those of a fast one are not. Rayleigh: ``h ~ CN(0, 1)``; Rician adds a
fixed line-of-sight component: ``sqrt(K / (K + 1)) + sqrt(1 / (K + 1)) g``.
"""

from __future__ import annotations

import numpy as np
from scipy.special import j0


def doppler_correlation(doppler_hz: np.ndarray | float, step_s: float) -> np.ndarray:
    """Lag-one correlation of the complex gain: ``J0(2 pi f_D dt)``."""
    return np.asarray(j0(2.0 * np.pi * np.asarray(doppler_hz, dtype=np.float64) * step_s))


def complex_normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """``CN(0, 1)`` samples (unit mean power), complex64."""
    re = rng.standard_normal(shape, dtype=np.float32)
    im = rng.standard_normal(shape, dtype=np.float32)
    out = np.empty(shape, dtype=np.complex64)
    # Row blocks: the complex128 intermediate of a whole n x n draw would be 16 bytes a link.
    rows = max(1, (1 << 22) // max(1, int(np.prod(shape[1:], dtype=np.int64))))
    for r in range(0, shape[0], rows):
        block = slice(r, r + rows)
        out[block] = (re[block] + 1j * im[block]) * np.float32(np.sqrt(0.5))
    return out


def ar1_scale(rho: np.ndarray) -> np.ndarray:
    """``sqrt(1 - rho^2)`` (float32), the weight of the innovation in :func:`ar1_step`."""
    rho = rho.astype(np.float32, copy=False)
    return np.asarray(np.sqrt(np.maximum(1.0 - rho**2, 0.0)))


def ar1_step(
    previous: np.ndarray,
    rho: np.ndarray,
    innovation: np.ndarray,
    scale: np.ndarray | None = None,
) -> np.ndarray:
    """``g_k = rho g_{k-1} + sqrt(1 - rho^2) w_k``: keeps unit power, correlation ``rho``.

    ``J0`` goes negative past its first zero; the AR(1) recursion uses it as it is, which
    reproduces the sign of the Jakes correlation at that lag. ``scale``: ``ar1_scale(rho)``
    where the caller has it (both directions of a pair share ``rho``). ``g`` is complex64,
    or one of its parts (float32): the same values (a real factor scales each part alike).
    """
    rho = rho.astype(np.float32, copy=False)
    if scale is None:
        scale = ar1_scale(rho)
    return np.asarray(rho * previous + scale * innovation, dtype=previous.dtype)


def power_gain(g: np.ndarray, k_factor_linear: float | None) -> np.ndarray:
    """``|h|^2`` from the scattered part ``g``: Rayleigh when ``k_factor_linear`` is None."""
    if k_factor_linear is None:
        return np.asarray(np.abs(g) ** 2)
    k = k_factor_linear
    h = np.sqrt(k / (k + 1.0)) + np.sqrt(1.0 / (k + 1.0)) * g
    return np.asarray(np.abs(h) ** 2)


def power_gain_parts(re: np.ndarray, im: np.ndarray, k_factor_linear: float | None) -> np.ndarray:
    """:func:`power_gain` of ``g`` given as its real and imaginary parts (float32): the
    parts put together as complex64 first, so the values are :func:`power_gain`'s own (a
    magnitude computed from the parts apart may differ in the last bit)."""
    g = np.empty(re.shape, dtype=np.complex64)
    g.real, g.imag = re, im
    return power_gain(g, k_factor_linear)
