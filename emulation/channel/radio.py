"""Radio formulas: path loss, noise, bit and packet errors, rate tables, burst parameters.

Pure functions on numpy arrays (dB and dBm unless a name says otherwise). Reference values
and defaults follow ``docs/emulation.md``: log-distance and 3GPP TR 38.901 path loss, the
802.11n/ac MCS table with its minimum receive sensitivities, the LTE CQI table with its
SINR thresholds at 10% BLER, and Gilbert-Elliott parameters derived from a fade margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import erfc

SPEED_OF_LIGHT = 299_792_458.0
#: Thermal noise density at 290 K, dBm per Hz.
THERMAL_NOISE_DBM_HZ = -174.0

FloatArray = np.ndarray


def db_to_linear(db: FloatArray | float) -> FloatArray:
    return np.power(10.0, np.asarray(db, dtype=np.float64) / 10.0)


def linear_to_db(linear: FloatArray | float) -> FloatArray:
    return 10.0 * np.log10(np.maximum(np.asarray(linear, dtype=np.float64), 1e-300))


def noise_floor_dbm(bandwidth_hz: float, noise_figure_db: float) -> float:
    """``-174 + 10 log10(B) + NF``: about -94 dBm for 20 MHz and a 7 dB noise figure."""
    return THERMAL_NOISE_DBM_HZ + 10.0 * math.log10(bandwidth_hz) + noise_figure_db


def free_space_loss_db(distance_m: FloatArray | float, frequency_hz: float) -> FloatArray:
    """Friis free-space loss ``20 log10(4 pi d f / c)``; 40.0 dB at 1 m and 2.4 GHz."""
    d = np.maximum(np.asarray(distance_m, dtype=np.float64), 1e-3)
    return 20.0 * np.log10(4.0 * math.pi * d * frequency_hz / SPEED_OF_LIGHT)


def log_distance_loss_db(
    distance_m: FloatArray | float, frequency_hz: float, exponent: float
) -> FloatArray:
    """``20 log10(4 pi f / c) + 10 n log10(d)``: free space up to 1 m, exponent ``n`` after.

    Distances under 1 m are clamped to 1 m (the reference distance).
    """
    d = np.maximum(np.asarray(distance_m, dtype=np.float64), 1.0)
    reference = 20.0 * math.log10(4.0 * math.pi * frequency_hz / SPEED_OF_LIGHT)
    return reference + 10.0 * exponent * np.log10(d)


#: 3GPP TR 38.901 Table 7.4.1-1 path loss models: ``(a, b, c)`` of ``a + b log10(d_3D) +
#: c log10(f_GHz)`` (for LOS of UMi and UMa: PL1, before the breakpoint; for NLOS: PL'_NLOS,
#: before the max with LOS and UMi/UMa's ``h_UT`` term) and the shadowing sigma in dB.
PATH_LOSS_38901: dict[str, tuple[float, float, float, float]] = {
    "umi-los": (32.4, 21.0, 20.0, 4.0),
    "umi-nlos": (22.4, 35.3, 21.3, 7.82),
    "uma-los": (28.0, 22.0, 20.0, 4.0),
    "uma-nlos": (13.54, 39.08, 20.0, 6.0),
    "inh-los": (32.4, 17.3, 20.0, 3.0),
    "inh-nlos": (17.3, 38.3, 24.9, 8.03),
}
#: Beyond the breakpoint (UMi, UMa LOS PL2): ``a + 40 log10(d_3D) + 20 log10(f_GHz) -
#: k log10(d'_BP^2 + (h_BS - h_UT)^2)``, ``k`` per family.
BREAKPOINT_TERM_38901: dict[str, float] = {"umi": 9.5, "uma": 9.0}
#: ``PL'_NLOS`` falls by ``k (h_UT - 1.5)`` (UMi 0.3, UMa 0.6; InH has no height term).
NLOS_HEIGHT_TERM_38901: dict[str, float] = {"umi": 0.3, "uma": 0.6}
#: Effective environment height ``h_E`` of the breakpoint (1 m for UMi; for UMa 1 m while
#: ``h_UT`` < 13 m, which 38.901 draws otherwise: the model keeps 1 m).
ENVIRONMENT_HEIGHT_M = 1.0
#: Where Table 7.4.1-1 holds: ``(lowest, highest)`` distance in metres and whether it is the
#: 2D (UMi, UMa) or the 3D distance (InH). The model extrapolates outside.
VALIDITY_38901: dict[str, tuple[float, float, str]] = {
    "umi": (10.0, 5000.0, "2D"),
    "uma": (10.0, 5000.0, "2D"),
    "inh": (1.0, 150.0, "3D"),
}
#: Shadowing decorrelation distances in metres (38.901 table 7.5-6).
DECORRELATION_38901: dict[str, float] = {
    "umi-los": 10.0,
    "umi-nlos": 13.0,
    "uma-los": 37.0,
    "uma-nlos": 50.0,
    "inh-los": 10.0,
    "inh-nlos": 6.0,
}

Heights = FloatArray | float


def breakpoint_distance_m(
    height_bs_m: Heights, height_ut_m: Heights, frequency_hz: float
) -> FloatArray:
    """38.901's LOS breakpoint ``d'_BP = 4 h'_BS h'_UT f_c / c``, ``h' = h - h_E`` (1 m).

    Two devices at 1.5 m: ``f_c / c``, 6.7 m at 2 GHz, 17.3 m at 5.18 GHz.
    """
    h_bs = np.asarray(height_bs_m, dtype=np.float64) - ENVIRONMENT_HEIGHT_M
    h_ut = np.asarray(height_ut_m, dtype=np.float64) - ENVIRONMENT_HEIGHT_M
    return 4.0 * h_bs * h_ut * frequency_hz / SPEED_OF_LIGHT


def path_loss_38901_db(
    model: str,
    distance_m: FloatArray | float,
    frequency_hz: float,
    height_a_m: Heights = 1.5,
    height_b_m: Heights = 1.5,
) -> FloatArray:
    """Path loss of a 3GPP TR 38.901 model (``umi-los`` ... ``inh-nlos``) between antennas at
    ``height_a_m`` and ``height_b_m`` a 2D ``distance_m`` apart.

    The higher end plays the base station, the lower the user terminal (so the loss is the
    same both ways); the formulas take the 3D distance (at least 1 m); UMi and UMa LOS bend at
    the breakpoint :func:`breakpoint_distance_m` (compared with the 2D distance, as in the
    table); NLOS is ``max(LOS, PL'_NLOS)``. Outside the table's distances
    (:data:`VALIDITY_38901`) the formulas are extrapolated.
    """
    _known_38901(model)
    family = model.split("-")[0]
    los, nlos = path_loss_38901_both_db(family, distance_m, frequency_hz, height_a_m, height_b_m)
    return nlos if model.endswith("-nlos") else los


def path_loss_38901_both_db(
    family: str,
    distance_m: FloatArray | float,
    frequency_hz: float,
    height_a_m: Heights = 1.5,
    height_b_m: Heights = 1.5,
) -> tuple[FloatArray, FloatArray]:
    """The line-of-sight and non-line-of-sight path loss of a 38.901 family (``umi``,
    ``uma``, ``inh``) at once (see :func:`path_loss_38901_db`)."""
    for model in (f"{family}-los", f"{family}-nlos"):
        _known_38901(model)
    d2 = np.asarray(distance_m, dtype=np.float64)
    h_a = np.asarray(height_a_m, dtype=np.float64)
    h_b = np.asarray(height_b_m, dtype=np.float64)
    h_bs, h_ut = np.maximum(h_a, h_b), np.minimum(h_a, h_b)
    dh2 = (h_bs - h_ut) ** 2
    # Equal heights (every preset): the 3D distance is the 2D one, and no array of them.
    d3 = np.maximum(d2 if not np.any(dh2) else np.sqrt(d2 * d2 + dh2), 1.0)
    log_d, log_f = np.log10(d3), math.log10(frequency_hz / 1e9)
    los = _loss_38901(f"{family}-los", log_d, log_f)
    if family in BREAKPOINT_TERM_38901:
        bp = breakpoint_distance_m(h_bs, h_ut, frequency_hz)
        a = PATH_LOSS_38901[f"{family}-los"][0]
        far = (a + 40.0 * log_d + 20.0 * log_f
               - BREAKPOINT_TERM_38901[family] * np.log10(bp * bp + dh2))  # fmt: skip
        los = np.where(d2 > bp, far, los)
    nlos = _loss_38901(f"{family}-nlos", log_d, log_f)
    if family in NLOS_HEIGHT_TERM_38901:
        nlos = nlos - NLOS_HEIGHT_TERM_38901[family] * (h_ut - 1.5)
    return np.asarray(los), np.asarray(np.maximum(nlos, los))


def _known_38901(model: str) -> None:
    if model not in PATH_LOSS_38901:
        raise ValueError(
            f"unknown 38.901 model '{model}'; choose one of: {', '.join(PATH_LOSS_38901)}"
        )


def _loss_38901(model: str, log_d: FloatArray, log_f: float) -> FloatArray:
    a, b, c, _ = PATH_LOSS_38901[model]
    return np.asarray(a + b * log_d + c * log_f)


def los_probability(
    model: str, distance_m: FloatArray | float, height_ut_m: Heights = 1.5
) -> FloatArray:
    """Probability that a link of a 38.901 family (``umi``, ``uma``, ``inh``) is line of
    sight at a 2D distance (Table 7.4.2-1; InH: mixed office; UMa's ``C'(h_UT)`` with the
    lower end's height)."""
    d = np.maximum(np.asarray(distance_m, dtype=np.float64), 1e-3)
    family = model.split("-")[0]
    if family == "umi":
        return np.where(d <= 18.0, 1.0, 18.0 / d + np.exp(-d / 36.0) * (1.0 - 18.0 / d))
    if family == "uma":
        h = np.asarray(height_ut_m, dtype=np.float64)
        c = np.where(h <= 13.0, 0.0, (np.clip(h, 13.0, 23.0) - 13.0) / 10.0) ** 1.5
        p = (18.0 / d + np.exp(-d / 63.0) * (1.0 - 18.0 / d)) * (
            1.0 + c * 1.25 * (d / 100.0) ** 3 * np.exp(-d / 150.0)
        )
        return np.where(d <= 18.0, 1.0, p)
    if family == "inh":  # indoor office, mixed
        p = np.exp(-(d - 1.2) / 4.7)
        p = np.where(d >= 6.5, np.exp(-(d - 6.5) / 32.6) * 0.32, p)
        return np.where(d <= 1.2, 1.0, p)
    raise ValueError(f"no LOS probability for '{model}'")


# -- bit and packet errors ------------------------------------------------------------------


def bit_error_rate(sinr_linear: FloatArray, bits_per_symbol: int) -> FloatArray:
    """Uncoded bit error probability of BPSK/QPSK or square M-QAM at a symbol SINR.

    BPSK/QPSK: ``0.5 erfc(sqrt(gamma_b))``; M-QAM: ``e = erfc(sqrt(3 gamma / (2 (M - 1))))``,
    ``SER = 2 (1 - 1/sqrt M) e - (1 - 2/sqrt M + 1/M) e^2``, ``P_b = SER / log2 M``.
    """
    gamma = np.maximum(np.asarray(sinr_linear, dtype=np.float64), 0.0)
    if bits_per_symbol <= 2:
        gamma_b = gamma / bits_per_symbol
        return np.asarray(0.5 * erfc(np.sqrt(gamma_b)))
    m = 2.0**bits_per_symbol
    e = erfc(np.sqrt(3.0 * gamma / (2.0 * (m - 1.0))))
    ser = 2.0 * (1.0 - 1.0 / math.sqrt(m)) * e - (1.0 - 2.0 / math.sqrt(m) + 1.0 / m) * e**2
    return np.asarray(np.clip(ser / bits_per_symbol, 0.0, 0.5))


def packet_error_rate(bit_error: FloatArray, packet_bytes: int) -> FloatArray:
    """``1 - (1 - P_b)^(8 L)`` for a packet of ``L`` bytes (computed stably with log1p)."""
    pb = np.clip(np.asarray(bit_error, dtype=np.float64), 0.0, 1.0 - 1e-16)
    return -np.expm1(8.0 * packet_bytes * np.log1p(-pb))


def block_error_shortcut(sinr_linear: FloatArray, m: float = 0.023) -> FloatArray:
    """The FL-over-wireless shortcut ``q = 1 - exp(-m / SINR)`` (10% at -6.7 dB)."""
    gamma = np.maximum(np.asarray(sinr_linear, dtype=np.float64), 1e-12)
    return -np.expm1(-m / gamma)


# -- rate tables -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RateTable:
    """Rate adaptation: the highest entry whose SINR threshold the link meets.

    Attributes
    ----------
    name:
        ``wifi`` (802.11n/ac) or ``lte`` (CQI).
    rates_bps:
        PHY rate of each entry.
    sinr_db:
        Minimum SINR of each entry, ascending.
    bits_per_symbol:
        Modulation order of each entry (for packet errors).
    """

    name: str
    rates_bps: np.ndarray
    sinr_db: np.ndarray
    bits_per_symbol: tuple[int, ...]

    def index(self, sinr_db: FloatArray) -> np.ndarray:
        """Entry chosen at each SINR; -1 where even the lowest is out of reach."""
        return np.searchsorted(self.sinr_db, np.asarray(sinr_db), side="right").astype(np.int64) - 1

    def rate(self, sinr_db: FloatArray) -> FloatArray:
        """PHY rate in bit/s at each SINR (0 below the lowest threshold)."""
        idx = self.index(sinr_db)
        return np.where(idx >= 0, self.rates_bps[np.maximum(idx, 0)], 0.0)

    @property
    def min_sinr_db(self) -> float:
        return float(self.sinr_db[0])


#: 802.11n/ac MCS 0-9: (bits per symbol, code rate).
WIFI_MCS: tuple[tuple[int, float], ...] = (
    (1, 1 / 2), (2, 1 / 2), (2, 3 / 4), (4, 1 / 2), (4, 3 / 4),
    (6, 2 / 3), (6, 3 / 4), (6, 5 / 6), (8, 3 / 4), (8, 5 / 6),
)  # fmt: skip
#: Minimum receive sensitivity of MCS 0-9 at 20 MHz, dBm (+3 dB per doubling of bandwidth).
WIFI_SENSITIVITY_20MHZ_DBM = (-82.0, -79.0, -77.0, -74.0, -70.0, -66.0, -65.0, -64.0, -59.0, -57.0)
#: Data subcarriers per bandwidth (802.11n/ac).
WIFI_DATA_SUBCARRIERS = {20: 52, 40: 108, 80: 234, 160: 468}

#: LTE CQI 1-15: spectral efficiency (bit/s/Hz) and SINR threshold at 10% BLER (dB).
LTE_CQI_EFFICIENCY = (
    0.1523, 0.2344, 0.3770, 0.6016, 0.8770, 1.1758, 1.4766, 1.9141,
    2.4063, 2.7305, 3.3223, 3.9023, 4.5234, 5.1152, 5.5547,
)  # fmt: skip
LTE_CQI_SINR_DB = (
    -6.7, -4.7, -2.3, 0.2, 2.4, 4.3, 5.9, 8.1, 10.3, 11.7, 14.1, 16.3, 18.7, 21.0, 22.7,
)  # fmt: skip
LTE_CQI_BITS = (2, 2, 2, 2, 2, 2, 4, 4, 4, 6, 6, 6, 6, 6, 6)


def wifi_mcs_rates_bps(
    bandwidth_mhz: int = 20, streams: int = 1, short_gi: bool = False
) -> np.ndarray:
    """802.11n/ac PHY rates of MCS 0-9: ``N_sd * bits * code_rate * streams / T_sym``.

    20 MHz, one stream, 800 ns guard interval: 6.5, 13, 19.5, 26, 39, 52, 58.5, 65, 78, 86.7
    Mbit/s (MCS 9 is not a valid 20 MHz single-stream rate in 802.11ac; it is listed anyway).
    """
    if bandwidth_mhz not in WIFI_DATA_SUBCARRIERS:
        raise ValueError(f"802.11 bandwidth must be one of {sorted(WIFI_DATA_SUBCARRIERS)} MHz")
    symbol_s = 3.6e-6 if short_gi else 4.0e-6
    n_sd = WIFI_DATA_SUBCARRIERS[bandwidth_mhz]
    return np.array([n_sd * bits * rate * streams / symbol_s for bits, rate in WIFI_MCS])


def wifi_sensitivity_dbm(bandwidth_mhz: int = 20) -> np.ndarray:
    """Minimum receive sensitivity of MCS 0-9 (dBm), +3 dB per doubling of bandwidth."""
    doublings = math.log2(bandwidth_mhz / 20)
    return np.array(WIFI_SENSITIVITY_20MHZ_DBM) + 3.0 * doublings


def wifi_rate_table(
    bandwidth_mhz: int, noise_figure_db: float, *, streams: int = 1, max_mcs: int = 8
) -> RateTable:
    """802.11 MCS table with SINR thresholds = sensitivity - noise floor.

    A receiver exactly at MCS0 sensitivity, with no interference, sits exactly at the MCS0
    threshold: "the link exists while received power >= MCS0 sensitivity" and "the MCS0
    SINR is met" agree.
    """
    floor = noise_floor_dbm(bandwidth_mhz * 1e6, noise_figure_db)
    count = max_mcs + 1
    return RateTable(
        name="wifi",
        rates_bps=wifi_mcs_rates_bps(bandwidth_mhz, streams)[:count],
        sinr_db=wifi_sensitivity_dbm(bandwidth_mhz)[:count] - floor,
        bits_per_symbol=tuple(bits for bits, _ in WIFI_MCS[:count]),
    )


def lte_rate_table(bandwidth_hz: float, overhead: float = 0.25) -> RateTable:
    """LTE CQI table: rate = efficiency * bandwidth * (1 - control/reference overhead)."""
    eff = np.array(LTE_CQI_EFFICIENCY)
    return RateTable(
        name="lte",
        rates_bps=eff * bandwidth_hz * (1.0 - overhead),
        sinr_db=np.array(LTE_CQI_SINR_DB),
        bits_per_symbol=LTE_CQI_BITS,
    )


def shannon_rate_bps(
    bandwidth_hz: float, sinr_linear: FloatArray, gap_db: float = 7.4
) -> FloatArray:
    """Shannon capacity with an SNR gap: ``B log2(1 + SINR / Gamma)``."""
    return np.asarray(
        bandwidth_hz * np.log2(1.0 + np.asarray(sinr_linear) / 10.0 ** (gap_db / 10.0))
    )


# -- Gilbert-Elliott from fading -------------------------------------------------------------


def doppler_hz(speed_mps: FloatArray | float, frequency_hz: float) -> FloatArray:
    """Maximum Doppler shift ``f_D = v f_c / c``."""
    return np.asarray(speed_mps, dtype=np.float64) * frequency_hz / SPEED_OF_LIGHT


@dataclass(frozen=True)
class BurstParameters:
    """Gilbert-Elliott transition probabilities per step and what they imply."""

    p: float  # good -> bad
    r: float  # bad -> good
    bad_share: float  # stationary share of time in the bad state, p / (p + r)
    mean_burst_steps: float  # 1 / r


def gilbert_elliott_from_fade_margin(rho: float, doppler: float, step_s: float) -> BurstParameters:
    """Bursts of a Rayleigh channel below a threshold ``rho`` (threshold / RMS amplitude).

    ``pi_B = 1 - exp(-rho^2)``; average fade duration ``AFD = (exp(rho^2) - 1) /
    (rho f_D sqrt(2 pi))``; ``r = T / AFD`` (capped at 1) and ``p = r pi_B / (1 - pi_B)``.
    """
    if rho <= 0 or doppler <= 0 or step_s <= 0:
        raise ValueError("fade margin, Doppler and step must be positive")
    bad = 1.0 - math.exp(-(rho**2))
    afd = (math.exp(rho**2) - 1.0) / (rho * doppler * math.sqrt(2.0 * math.pi))
    r = min(1.0, step_s / afd)
    p = min(1.0, r * bad / (1.0 - bad))
    return BurstParameters(p=p, r=r, bad_share=bad, mean_burst_steps=1.0 / r)


def gilbert_elliott_from_trace(bad_share: float, lag1_correlation: float) -> tuple[float, float]:
    """``(p, r)`` from a loss trace's loss share and lag-1 autocorrelation."""
    return bad_share * (1.0 - lag1_correlation), (1.0 - bad_share) * (1.0 - lag1_correlation)
