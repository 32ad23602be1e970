"""Path loss against distance for a scenario, beside 3GPP TR 38.901's own geometry.

What ``airgossip links --path-loss`` prints and draws: the model's loss as the scenario's
links see it (both ends at the scenario's antenna height: device to device) and the loss
38.901 gives for the base-station geometry its scenario family was measured in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from airgossip.emulation.channel import radio
from airgossip.scenario.wireless import WirelessSettings

#: The geometry of 38.901's scenario families (Table 7.2-1 / 7.4.1-1): base station and user
#: terminal heights in metres.
STANDARD_HEIGHTS_M: dict[str, tuple[float, float]] = {
    "umi": (10.0, 1.5),
    "uma": (25.0, 1.5),
    "inh": (3.0, 1.0),
}
#: Rows of the table: 1-2-5 steps.
TABLE_DISTANCES_M = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)


@dataclass(frozen=True)
class PathLossCurves:
    """Path loss (dB) at each distance (m, 2D) of a scenario and of its reference.

    ``model_los``/``model_nlos``: the model between two nodes at the scenario's antenna
    height (for log-distance and free space, ``model_los`` is its one loss and
    ``model_nlos`` None); ``los_probability``: the chance a pair is line of sight (None
    where the model does not draw it); ``standard_los``/``standard_nlos``: 38.901 at the
    base-station geometry of :data:`STANDARD_HEIGHTS_M` (for log-distance: free space);
    ``valid``: whether 38.901 defines the distance (always True for log-distance).
    """

    model: str
    height_m: float
    breakpoint_m: float | None
    standard_heights_m: tuple[float, float] | None
    distance_m: np.ndarray
    model_los: np.ndarray
    model_nlos: np.ndarray | None
    los_probability: np.ndarray | None
    standard_los: np.ndarray
    standard_nlos: np.ndarray | None
    valid: np.ndarray


def path_loss_curves(settings: WirelessSettings, distance_m: np.ndarray) -> PathLossCurves:
    """The curves of :class:`PathLossCurves` for a ``[wireless]`` table (at its lowest antenna
    height where it lists one per agent)."""
    pl = settings.path_loss
    f = settings.frequency_ghz * 1e9
    heights = settings.antenna_height_m
    h = float(min(heights)) if isinstance(heights, list) else float(heights)
    d = np.asarray(distance_m, dtype=np.float64)
    if pl.model in ("log-distance", "free-space"):
        exponent = pl.exponent if pl.model == "log-distance" else 2.0
        return PathLossCurves(
            pl.model, h, None, None, d, radio.log_distance_loss_db(d, f, exponent), None, None,
            radio.free_space_loss_db(np.maximum(d, 1.0), f), None, np.ones(d.shape, dtype=bool),
        )  # fmt: skip
    family = pl.model.split("-")[0]
    los, nlos = radio.path_loss_38901_both_db(family, d, f, h, h)
    h_bs, h_ut = STANDARD_HEIGHTS_M[family]
    std_los, std_nlos = radio.path_loss_38901_both_db(family, d, f, h_bs, h_ut)
    low, high, kind = radio.VALIDITY_38901[family]
    span = np.sqrt(d**2 + (h_bs - h_ut) ** 2) if kind == "3D" else d
    mixed = pl.model in ("umi", "uma", "inh")
    bp = float(radio.breakpoint_distance_m(h, h, f)) if family in ("umi", "uma") else None
    return PathLossCurves(
        pl.model, h, bp, (h_bs, h_ut), d,
        los if not pl.model.endswith("-nlos") else nlos,
        nlos if mixed else None,
        radio.los_probability(family, d, h) if mixed else None,
        std_los if not pl.model.endswith("-nlos") else std_nlos,
        std_nlos if mixed else None,
        (span >= low) & (span <= high),
    )  # fmt: skip
