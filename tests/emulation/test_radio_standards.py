"""The radio model held against the tables it cites, value by value.

Each test names its source and writes the source's own formula here, independently of the
model's helpers (no call into ``airgossip.emulation.channel`` computes an expected value): 3GPP TR
38.901 V17 Table 7.4.1-1 (path loss, shadowing, breakpoint, validity), Table 7.4.2-1 (LOS
probability), Table 7.5-6 (shadowing decorrelation); IEEE 802.11-2016 HT and VHT MCS tables
(19.5, 21.5) and minimum sensitivities (Tables 19-23 and 21-25); 3GPP TS 36.213 Table
7.2.3-1 (4-bit CQI); Clarke/Jakes fading and the Doppler shift. Path loss within 0.1 dB,
MCS rates, sensitivities and CQI efficiencies exactly.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

import numpy as np
import pytest

from airgossip.emulation.channel import fading, radio
from airgossip.scenario.wireless import WirelessSettings

C = 299_792_458.0  # m/s
DB = 0.1  # the tolerance of path loss, dB


def log10(x: float) -> float:
    return math.log10(x)


# -- 3GPP TR 38.901 Table 7.4.1-1, written from the table ------------------------------------


def d3d(d2d: float, h_bs: float, h_ut: float) -> float:
    return math.sqrt(d2d**2 + (h_bs - h_ut) ** 2)


def bp(h_bs: float, h_ut: float, fc_hz: float) -> float:
    """d'_BP = 4 h'_BS h'_UT f_c / c with h' = h - 1 m (note 1 of the table)."""
    return 4 * (h_bs - 1.0) * (h_ut - 1.0) * fc_hz / C


def umi_los(d2d: float, fc_ghz: float, h_bs: float, h_ut: float) -> float:
    d, dbp = d3d(d2d, h_bs, h_ut), bp(h_bs, h_ut, fc_ghz * 1e9)
    if d2d <= dbp:
        return 32.4 + 21 * log10(d) + 20 * log10(fc_ghz)
    return (32.4 + 40 * log10(d) + 20 * log10(fc_ghz)
            - 9.5 * log10(dbp**2 + (h_bs - h_ut) ** 2))  # fmt: skip


def umi_nlos(d2d: float, fc_ghz: float, h_bs: float, h_ut: float) -> float:
    d = d3d(d2d, h_bs, h_ut)
    pl_nlos = 35.3 * log10(d) + 22.4 + 21.3 * log10(fc_ghz) - 0.3 * (h_ut - 1.5)
    return max(umi_los(d2d, fc_ghz, h_bs, h_ut), pl_nlos)


def uma_los(d2d: float, fc_ghz: float, h_bs: float, h_ut: float) -> float:
    # h_E = 1 m: what the table draws for h_UT < 13 m (C(d_2D, h_UT) = 0 there)
    d, dbp = d3d(d2d, h_bs, h_ut), bp(h_bs, h_ut, fc_ghz * 1e9)
    if d2d <= dbp:
        return 28.0 + 22 * log10(d) + 20 * log10(fc_ghz)
    return (28.0 + 40 * log10(d) + 20 * log10(fc_ghz)
            - 9 * log10(dbp**2 + (h_bs - h_ut) ** 2))  # fmt: skip


def uma_nlos(d2d: float, fc_ghz: float, h_bs: float, h_ut: float) -> float:
    d = d3d(d2d, h_bs, h_ut)
    pl_nlos = 13.54 + 39.08 * log10(d) + 20 * log10(fc_ghz) - 0.6 * (h_ut - 1.5)
    return max(uma_los(d2d, fc_ghz, h_bs, h_ut), pl_nlos)


def inh_los(d2d: float, fc_ghz: float, h_bs: float, h_ut: float) -> float:
    return 32.4 + 17.3 * log10(d3d(d2d, h_bs, h_ut)) + 20 * log10(fc_ghz)


def inh_nlos(d2d: float, fc_ghz: float, h_bs: float, h_ut: float) -> float:
    pl_nlos = 38.3 * log10(d3d(d2d, h_bs, h_ut)) + 17.30 + 24.9 * log10(fc_ghz)
    return max(inh_los(d2d, fc_ghz, h_bs, h_ut), pl_nlos)


STANDARD = {
    "umi-los": umi_los, "umi-nlos": umi_nlos, "uma-los": uma_los, "uma-nlos": uma_nlos,
    "inh-los": inh_los, "inh-nlos": inh_nlos,
}  # fmt: skip

# (model, f_c GHz, h_BS, h_UT, 2D distances inside the table's range): the table's own
# geometry (UMi h_BS 10 m, UMa 25 m, InH 3 m ceiling to 1 m), both sides of each breakpoint,
# and device to device (both ends at 1.5 m, the presets' choice).
POINTS = [
    ("umi-los", 3.5, 10.0, 1.5, [10, 50, 150, 209, 212, 500, 1000, 5000]),
    ("umi-los", 28.0, 10.0, 1.5, [10, 100, 1000, 1700, 5000]),
    ("umi-nlos", 3.5, 10.0, 1.5, [10, 50, 150, 500, 1000, 5000]),
    ("umi-nlos", 2.0, 10.0, 8.0, [20, 300, 2000]),
    ("umi-los", 2.0, 1.5, 1.5, [10, 20, 100, 1000]),
    ("umi-nlos", 2.0, 1.5, 1.5, [10, 20, 100, 1000]),
    ("uma-los", 2.0, 25.0, 1.5, [10, 100, 300, 700, 1000, 5000]),
    ("uma-los", 3.5, 25.0, 1.5, [10, 100, 1000, 1500, 5000]),
    ("uma-nlos", 3.5, 25.0, 1.5, [10, 100, 500, 1000, 5000]),
    ("uma-nlos", 2.0, 25.0, 10.0, [50, 800, 3000]),
    ("uma-los", 2.0, 1.5, 1.5, [10, 100, 1000]),
    ("uma-nlos", 2.0, 1.5, 1.5, [10, 100, 1000]),
    ("inh-los", 5.18, 3.0, 1.0, [1, 5, 20, 60, 149]),
    ("inh-nlos", 5.18, 3.0, 1.0, [1, 5, 20, 60, 149]),
    ("inh-los", 28.0, 3.0, 1.0, [1, 10, 100]),
    ("inh-nlos", 2.4, 1.0, 1.0, [1, 10, 100, 150]),
]


@pytest.mark.parametrize(("model", "fc", "h_bs", "h_ut", "distances"), POINTS)
def test_38901_table_7_4_1_1_path_loss(
    model: str, fc: float, h_bs: float, h_ut: float, distances: list[float]
) -> None:
    """TR 38.901 Table 7.4.1-1: PL1/PL2 about the breakpoint, NLOS = max(LOS, PL'_NLOS), 3D
    distance; the same loss whichever end sends (the higher end plays the base station)."""
    d = np.array(distances, dtype=np.float64)
    expected = np.array([STANDARD[model](x, fc, h_bs, h_ut) for x in distances])
    got = radio.path_loss_38901_db(model, d, fc * 1e9, h_bs, h_ut)
    np.testing.assert_allclose(got, expected, atol=DB, rtol=0)
    np.testing.assert_allclose(radio.path_loss_38901_db(model, d, fc * 1e9, h_ut, h_bs),
                               expected, atol=DB, rtol=0)  # fmt: skip
    family = model.split("-")[0]
    los, nlos = radio.path_loss_38901_both_db(family, d, fc * 1e9, h_bs, h_ut)
    np.testing.assert_allclose(nlos if model.endswith("nlos") else los, expected, atol=DB, rtol=0)


def test_38901_reference_numbers() -> None:
    """A few values of Table 7.4.1-1 worked by hand (3.5 GHz, UMi 10 m / 1.5 m): the
    breakpoint 4 * 9 * 0.5 * 3.5e9 / c = 210.1 m; at 100 m (PL1) 32.4 + 21 log10(100.36) +
    20 log10(3.5) = 85.3 dB; at 1 km (PL2) 32.4 + 120.0 + 10.9 - 9.5 log10(210.1^2 + 72.25)
    = 119.2 dB."""
    assert bp(10, 1.5, 3.5e9) == pytest.approx(210.15, abs=0.01)
    assert float(radio.breakpoint_distance_m(10.0, 1.5, 3.5e9)) == pytest.approx(210.15, abs=0.01)
    assert float(radio.path_loss_38901_db("umi-los", 100.0, 3.5e9, 10, 1.5)) == pytest.approx(
        85.3, abs=DB
    )
    assert float(radio.path_loss_38901_db("umi-los", 1000.0, 3.5e9, 10, 1.5)) == pytest.approx(
        119.2, abs=DB
    )
    # device to device at 2 GHz: d'_BP = 4 * 0.5 * 0.5 * 2e9 / c = 6.67 m
    assert float(radio.breakpoint_distance_m(1.5, 1.5, 2e9)) == pytest.approx(6.67, abs=0.01)


@pytest.mark.parametrize("family", ["umi", "uma"])
def test_38901_breakpoint_is_continuous_and_steepens_to_40_db_a_decade(family: str) -> None:
    f = 3.5e9
    h_bs, h_ut = (10.0, 1.5) if family == "umi" else (25.0, 1.5)
    # equal-height breakpoint: PL1 and PL2 meet there exactly when h_BS = h_UT
    dbp = bp(2.0, 2.0, f)
    below, above = radio.path_loss_38901_db(f"{family}-los", np.array([dbp * 0.999, dbp * 1.001]),
                                            f, 2.0, 2.0)  # fmt: skip
    assert abs(float(above - below)) < 0.05
    far = radio.path_loss_38901_db(f"{family}-los", np.array([2000.0, 20000.0]), f, h_bs, h_ut)
    assert float(far[1] - far[0]) == pytest.approx(40.0, abs=0.05)


def test_38901_shadowing_sigmas_and_decorrelation() -> None:
    """Table 7.4.1-1 sigma_SF (dB) and Table 7.5-6 SF decorrelation distances (m)."""
    sigma = {"umi-los": 4.0, "umi-nlos": 7.82, "uma-los": 4.0, "uma-nlos": 6.0,
             "inh-los": 3.0, "inh-nlos": 8.03}  # fmt: skip
    corr = {"umi-los": 10.0, "umi-nlos": 13.0, "uma-los": 37.0, "uma-nlos": 50.0,
            "inh-los": 10.0, "inh-nlos": 6.0}  # fmt: skip
    assert {k: v[3] for k, v in radio.PATH_LOSS_38901.items()} == sigma
    assert corr == radio.DECORRELATION_38901


def test_38901_ranges_of_validity() -> None:
    """Table 7.4.1-1: 10 m <= d_2D <= 5 km (UMi, UMa), 1 m <= d_3D <= 150 m (InH)."""
    assert radio.VALIDITY_38901 == {
        "umi": (10.0, 5000.0, "2D"), "uma": (10.0, 5000.0, "2D"), "inh": (1.0, 150.0, "3D"),
    }  # fmt: skip


def p_los(family: str, d: float, h_ut: float = 1.5) -> float:
    """TR 38.901 Table 7.4.2-1 (InH: mixed office)."""
    if family == "umi":
        return 1.0 if d <= 18 else 18 / d + math.exp(-d / 36) * (1 - 18 / d)
    if family == "uma":
        if d <= 18:
            return 1.0
        c = 0.0 if h_ut <= 13 else ((h_ut - 13) / 10) ** 1.5
        return (18 / d + math.exp(-d / 63) * (1 - 18 / d)) * (
            1 + c * 5 / 4 * (d / 100) ** 3 * math.exp(-d / 150)
        )
    if d <= 1.2:
        return 1.0
    if d < 6.5:
        return math.exp(-(d - 1.2) / 4.7)
    return math.exp(-(d - 6.5) / 32.6) * 0.32


@pytest.mark.parametrize(
    ("family", "h_ut", "distances"),
    [
        ("umi", 1.5, [5, 18, 18.5, 40, 100, 500, 2000]),
        ("uma", 1.5, [5, 18, 30, 100, 300, 1000]),
        ("uma", 20.0, [30, 100, 200, 400, 1000]),
        ("inh", 1.0, [0.5, 1.2, 3, 6.4, 6.5, 20, 80]),
    ],
)
def test_38901_table_7_4_2_1_los_probability(
    family: str, h_ut: float, distances: list[float]
) -> None:
    got = radio.los_probability(family, np.array(distances, dtype=np.float64), h_ut)
    expected = [p_los(family, d, h_ut) for d in distances]
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_heights_below_the_environment_are_refused_for_umi_and_uma() -> None:
    with pytest.raises(ValueError, match="antenna_height_m must be above 1 m"):
        WirelessSettings(path_loss={"model": "umi"}, antenna_height_m=1.0)
    WirelessSettings(path_loss={"model": "inh"}, antenna_height_m=1.0)  # InH has no breakpoint


# -- IEEE 802.11-2016: HT (clause 19) and VHT (clause 21) ------------------------------------

#: (N_BPSCS, R) of MCS 0-9.
MCS = [(1, Fraction(1, 2)), (2, Fraction(1, 2)), (2, Fraction(3, 4)), (4, Fraction(1, 2)),
       (4, Fraction(3, 4)), (6, Fraction(2, 3)), (6, Fraction(3, 4)), (6, Fraction(5, 6)),
       (8, Fraction(3, 4)), (8, Fraction(5, 6))]  # fmt: skip
#: N_SD, data subcarriers, per bandwidth.
N_SD = {20: 52, 40: 108, 80: 234}
#: The MCS tables' printed rates (Mbit/s, one stream, 800 ns GI): HT 20/40 MHz (MCS 0-7)
#: and VHT (MCS 8-9; MCS 9 at 20 MHz is not valid for one stream and not printed).
PRINTED_RATES = {
    20: ["6.5", "13.0", "19.5", "26.0", "39.0", "52.0", "58.5", "65.0", "78.0", None],
    40: ["13.5", "27.0", "40.5", "54.0", "81.0", "108.0", "121.5", "135.0", "162.0", "180.0"],
    80: ["29.3", "58.5", "87.8", "117.0", "175.5", "234.0", "263.3", "292.5", "351.0", "390.0"],
}
#: Minimum input sensitivity (dBm), Table 19-23 (HT, MCS 0-7) and Table 21-25 (VHT, 0-9).
SENSITIVITY = {
    20: [-82, -79, -77, -74, -70, -66, -65, -64, -59, -57],
    40: [-79, -76, -74, -71, -67, -63, -62, -61, -56, -54],
    80: [-76, -73, -71, -68, -64, -60, -59, -58, -53, -51],
    160: [-73, -70, -68, -65, -61, -57, -56, -55, -50, -48],
}


@pytest.mark.parametrize("bandwidth", [20, 40, 80])
def test_80211_mcs_rates(bandwidth: int) -> None:
    """Data rate = N_SD * N_BPSCS * R * N_SS / T_SYM, T_SYM = 4 us (800 ns GI)."""
    got = radio.wifi_mcs_rates_bps(bandwidth)
    for mcs, ((bits, rate), printed) in enumerate(zip(MCS, PRINTED_RATES[bandwidth],
                                                       strict=True)):  # fmt: skip
        exact = Fraction(N_SD[bandwidth]) * bits * rate / Fraction(4, 1_000_000)  # bit/s
        assert got[mcs] == pytest.approx(float(exact), rel=1e-12)
        if printed is not None:  # the table prints one decimal, rounded half up
            shown = Decimal(float(got[mcs]) / 1e6).quantize(Decimal("0.1"), ROUND_HALF_UP)
            assert str(shown) == printed
    # two streams: twice (the HT table's MCS 15 at 20 MHz, 130 Mbit/s)
    assert radio.wifi_mcs_rates_bps(20, streams=2)[7] == pytest.approx(130e6, rel=1e-12)


@pytest.mark.parametrize("bandwidth", [20, 40, 80, 160])
def test_80211_minimum_sensitivities(bandwidth: int) -> None:
    assert radio.wifi_sensitivity_dbm(bandwidth).tolist() == SENSITIVITY[bandwidth]


# -- 3GPP TS 36.213 Table 7.2.3-1 (4-bit CQI) ------------------------------------------------

#: (modulation order Q_m, code rate x 1024, printed efficiency) of CQI 1-15.
CQI = [(2, 78, "0.1523"), (2, 120, "0.2344"), (2, 193, "0.3770"), (2, 308, "0.6016"),
       (2, 449, "0.8770"), (2, 602, "1.1758"), (4, 378, "1.4766"), (4, 490, "1.9141"),
       (4, 616, "2.4063"), (6, 466, "2.7305"), (6, 567, "3.3223"), (6, 666, "3.9023"),
       (6, 772, "4.5234"), (6, 873, "5.1152"), (6, 948, "5.5547")]  # fmt: skip


def test_36213_cqi_efficiencies() -> None:
    """Efficiency = Q_m * (code rate x 1024) / 1024, printed to four decimals (half up)."""
    for (qm, rate, printed), value, bits in zip(CQI, radio.LTE_CQI_EFFICIENCY,
                                                radio.LTE_CQI_BITS, strict=True):  # fmt: skip
        exact = Decimal(qm * rate) / Decimal(1024)
        assert str(exact.quantize(Decimal("0.0001"), ROUND_HALF_UP)) == printed
        assert f"{value:.4f}" == printed and value == float(printed)
        assert bits == qm
    table = radio.lte_rate_table(10e6)
    assert table.rates_bps[0] == pytest.approx(0.1523 * 10e6 * 0.75, rel=1e-12)


# -- fading and Doppler -----------------------------------------------------------------------


def bessel_j0(x: float) -> float:
    """J0(x) = (1/pi) int_0^pi cos(x sin t) dt (Simpson, 2,000 intervals)."""
    n = 2000
    h = math.pi / n
    total = sum((1 if k in (0, n) else 4 if k % 2 else 2) * math.cos(x * math.sin(k * h))
                for k in range(n + 1))  # fmt: skip
    return total * h / 3 / math.pi


def test_doppler_shift() -> None:
    """f_D = v f_c / c: 1 m/s at 2.4 GHz is 8.0056 Hz; 1.4 m/s at 2 GHz, 9.339 Hz."""
    assert float(radio.doppler_hz(1.0, 2.4e9)) == pytest.approx(1.0 * 2.4e9 / C, rel=1e-12)
    assert float(radio.doppler_hz(1.4, 2.0e9)) == pytest.approx(9.3398, abs=1e-4)


@pytest.mark.parametrize("fd_tau", [0.01, 0.05, 0.2, 0.3827, 0.5, 1.0])
def test_jakes_autocorrelation(fd_tau: float) -> None:
    """Clarke/Jakes: the complex gain's autocorrelation at lag tau is J0(2 pi f_D tau)."""
    got = float(fading.doppler_correlation(fd_tau, 1.0))
    assert got == pytest.approx(bessel_j0(2 * math.pi * fd_tau), abs=1e-9)


@pytest.mark.parametrize("k_db", [-10.0, 0.0, 3.0, 10.0])
def test_rician_power_and_k_factor(k_db: float) -> None:
    """Rician h = sqrt(K/(K+1)) + sqrt(1/(K+1)) CN(0, 1): mean power 1, the specular share
    K/(K+1) (|E h|^2), var |h|^2 = (2K + 1) / (K + 1)^2; K -> Rayleigh's Exp(1) at K = 0."""
    k = 10 ** (k_db / 10)
    rng = np.random.default_rng(7)
    g = fading.complex_normal(rng, (400_000,))
    power = fading.power_gain(g, k)
    assert float(power.mean()) == pytest.approx(1.0, abs=0.01)
    assert float(power.var()) == pytest.approx((2 * k + 1) / (k + 1) ** 2, abs=0.02)
    rayleigh = fading.power_gain(g, None)
    assert float(rayleigh.mean()) == pytest.approx(1.0, abs=0.01)
    assert float(rayleigh.var()) == pytest.approx(1.0, abs=0.02)  # Exp(1)
