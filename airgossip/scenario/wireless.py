"""Wireless scenarios: the ``[wireless]`` table of a run config, and the named presets.

A scenario is an ordinary run config (TOML) with a ``[wireless]`` table; presets live in
``airgossip/scenario/presets/*.toml``. ``airgossip run --scenario NAME|FILE`` loads one as the
base that ``--config`` and flags override. Every field is validated up front, with errors
that name the field and what is allowed.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: The channel widths 802.11n/ac define (the radio model's data subcarriers are per width).
WIFI_BANDWIDTHS_MHZ = (20, 40, 80, 160)


PATH_LOSS_MODELS = (
    "log-distance", "free-space", "umi", "uma", "inh",
    "umi-los", "umi-nlos", "uma-los", "uma-nlos", "inh-los", "inh-nlos",
)  # fmt: skip


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PathLossSettings(_Strict):
    """``[wireless.path_loss]``: large-scale loss and shadowing."""

    model: str = "log-distance"
    exponent: float = Field(3.0, ge=1.5, le=6.0, description="log-distance exponent n")
    shadowing_db: float | None = Field(
        None, ge=0, le=20, description="shadowing sigma; default: the model's (6 for log-distance)"
    )
    decorrelation_m: float | None = Field(None, gt=0, description="shadowing correlation distance")

    @field_validator("model")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in PATH_LOSS_MODELS:
            raise ValueError(
                f"unknown path loss model '{value}'; choose one of: {', '.join(PATH_LOSS_MODELS)}"
            )
        return value


class FadingSettings(_Strict):
    """``[wireless.fading]``: fast fading, correlated in time through the Doppler shift."""

    model: Literal["rayleigh", "rician", "none"] = "rayleigh"
    k_factor_db: float = Field(6.0, ge=-10, le=30, description="Rician K factor")
    environment_speed_mps: float = Field(
        0.3, ge=0, description="scatterers' speed: static links still fade slowly"
    )


class BurstSettings(_Strict):
    """``[wireless.burst]``: bursty loss. ``fading``: a link is in its bad state while its
    instantaneous SINR is below the lowest rate's threshold; ``gilbert-elliott``: a given
    chain per link (``p``, ``r`` per step); ``none``: no bursts."""

    model: Literal["fading", "gilbert-elliott", "none"] = "fading"
    p: float = Field(0.05, ge=0, le=1)
    r: float = Field(0.5, ge=0, le=1)
    loss_good: float = Field(0.0, ge=0, le=1)
    loss_bad: float = Field(1.0, ge=0, le=1)

    @model_validator(mode="after")
    def _chain(self) -> BurstSettings:
        if self.model == "gilbert-elliott" and self.p + self.r == 0:
            raise ValueError("gilbert-elliott needs p + r > 0")
        return self


class MobilitySettings(_Strict):
    """``[wireless.mobility]``."""

    model: Literal["static", "random-waypoint", "gauss-markov"] = "static"
    area_m: tuple[float, float] = (50.0, 50.0)
    positions: list[tuple[float, float]] | None = Field(
        None, description="static: one [x, y] per agent (default: uniform in the area)"
    )
    min_speed_mps: float = Field(0.5, ge=0)
    max_speed_mps: float = Field(1.5, ge=0)
    pause_s: float = Field(0.0, ge=0)
    mean_speed_mps: float = Field(1.0, ge=0)
    speed_sigma_mps: float = Field(0.3, ge=0)
    memory: float = Field(0.85, ge=0, le=1, description="Gauss-Markov alpha")

    @model_validator(mode="after")
    def _speeds(self) -> MobilitySettings:
        if self.area_m[0] <= 0 or self.area_m[1] <= 0:
            raise ValueError("area_m must be two positive sizes [width, height]")
        if self.model == "random-waypoint":
            if self.min_speed_mps <= 0:
                raise ValueError(
                    "random-waypoint needs min_speed_mps > 0 (with 0 the average speed decays)"
                )
            if self.max_speed_mps < self.min_speed_mps:
                raise ValueError("max_speed_mps must be >= min_speed_mps")
        return self


class TraceSettings(_Strict):
    """``[[wireless.traces]]``: a rate trace driving some links' rate."""

    file: Path
    format: Literal["mahimahi", "mbps"] = "mbps"
    links: Literal["all"] | list[tuple[int, int]] = "all"


class WirelessSettings(_Strict):
    """``[wireless]``: radios, propagation, mobility, bursts, traces and shared air."""

    name: str = "custom"
    radio: Literal["wifi", "lte"] = "wifi"
    step_s: float = Field(0.5, ge=0.05, le=5.0, description="model time step")
    frequency_ghz: float = Field(2.4, gt=0.1, le=100)
    bandwidth_mhz: float = Field(20.0, gt=0)
    tx_power_dbm: float | list[float] = 20.0
    antenna_gain_dbi: float = Field(0.0, ge=-20, le=40, description="tx + rx antenna gain")
    antenna_height_m: float | list[float] = Field(
        1.5,
        description="antenna height above ground, or one per agent: devices at 1.5 m, as "
        "3GPP TR 37.885 places both ends of a sidelink",
    )
    noise_figure_db: float | list[float] = 7.0
    streams: int = Field(1, ge=1, le=8)
    max_mcs: int = Field(8, ge=0, le=9)
    mac_efficiency: float = Field(0.65, gt=0, le=1)
    retries: int = Field(7, ge=0, le=30, description="link-layer retransmissions per packet")
    packet_bytes: int = Field(1500, ge=64, le=65536)
    chunk_bytes: int = Field(1 << 20, ge=1024, description="loss is decided per chunk")
    loss_timeout_ms: float = Field(
        200.0, ge=0, le=60_000, description="how long a sender takes to notice a lost chunk"
    )
    max_stall_s: float = Field(
        5.0, gt=0, le=600, description="a transfer stalled in a fade this long is lost"
    )
    latency_ms: float = Field(1.0, ge=0, le=10_000, description="access + processing delay")
    jitter_ms: float = Field(0.5, ge=0, le=10_000)
    activity: float = Field(
        0.05, ge=0, le=1, description="share of time a node transmits (interference)"
    )
    access: Literal["csma", "scheduled"] | None = Field(
        None,
        description="csma: nodes heard above carrier_sense_dbm defer and share the air; "
        "scheduled: no carrier sense. Default: csma for wifi, scheduled for lte",
    )
    carrier_sense_dbm: float = Field(-82.0, ge=-130, le=0)
    shared_air: bool = True
    max_out_degree: int = Field(4, ge=1, le=4096, description="gossip out-neighbours per node")
    gossip_margin_db: float = Field(
        10.0, ge=0, le=60, description="gossip prefers links this far above sensitivity"
    )
    graph_interval_s: float = Field(2.0, gt=0, description="how often the gossip graph is rebuilt")
    compute_s: float = Field(0.05, ge=0, description="virtual clock: seconds one local step takes")
    record: bool = Field(False, description="write links.jsonl, a replay log of link states")
    epoch_unix: float | None = Field(
        None, description="wall-clock time of the scenario's t = 0 (set by the launcher)"
    )
    path_loss: PathLossSettings = Field(default_factory=PathLossSettings)
    fading: FadingSettings = Field(default_factory=FadingSettings)
    burst: BurstSettings = Field(default_factory=BurstSettings)
    mobility: MobilitySettings = Field(default_factory=MobilitySettings)
    traces: list[TraceSettings] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> WirelessSettings:
        if self.radio == "wifi" and int(self.bandwidth_mhz) not in WIFI_BANDWIDTHS_MHZ:
            raise ValueError(
                f"wifi bandwidth_mhz must be one of {', '.join(map(str, WIFI_BANDWIDTHS_MHZ))}, "
                f"got {self.bandwidth_mhz:g}"
            )
        heights = self.antenna_height_m
        heights = heights if isinstance(heights, list) else [heights]
        if any(not 0 < h <= 300 for h in heights):
            raise ValueError("wireless.antenna_height_m must be between 0 and 300 m")
        family = self.path_loss.model.split("-")[0]
        if family in ("umi", "uma") and any(h <= 1.0 for h in heights):
            raise ValueError(
                f"wireless.antenna_height_m must be above 1 m with {self.path_loss.model} path "
                "loss (38.901's breakpoint takes the height above a 1 m environment)"
            )
        return self

    @property
    def carrier_sense(self) -> float | None:
        """The carrier-sense level under CSMA, None under scheduled access."""
        access = self.access or ("csma" if self.radio == "wifi" else "scheduled")
        return self.carrier_sense_dbm if access == "csma" else None

    def per_node(self, name: str, n: int) -> list[float]:
        """A per-node setting (``tx_power_dbm``, ``noise_figure_db``) as ``n`` values."""
        value = getattr(self, name)
        if isinstance(value, list):
            if len(value) != n:
                raise ValueError(f"wireless.{name} lists {len(value)} values for {n} agents")
            return [float(v) for v in value]
        return [float(value)] * n


def preset_names() -> list[str]:
    """Names of the bundled scenarios."""
    folder = resources.files("airgossip.scenario") / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


class ScenarioNotFound(ValueError):
    pass


def scenario_path(name_or_file: str) -> Path:
    """A preset name or a TOML file -> the file to read."""
    candidate = Path(name_or_file)
    if candidate.suffix == ".toml" or candidate.exists():
        if not candidate.exists():
            raise ScenarioNotFound(f"scenario file {candidate} does not exist")
        return candidate
    names = preset_names()
    if name_or_file not in names:
        raise ScenarioNotFound(
            f"unknown scenario '{name_or_file}'; choose one of: {', '.join(names)}, "
            "or give a .toml file"
        )
    return Path(str(resources.files("airgossip.scenario") / "presets" / f"{name_or_file}.toml"))
