"""``[[device_classes]]``: fleets as uneven as real devices.

A scenario may sort its agents into device classes, each with a compute speed relative to
the machine that emulates it and the power it draws::

    [[device_classes]]
    name = "pi"
    fraction = 0.2        # of the fleet, drawn by the run's seed (or: agents = [3, 7])
    speed = 0.2           # a local step takes 5 times as long as the host's
    compute_w = 4.0       # power drawn while computing (W)
    tx_w = 1.2            # ... while transmitting, and receiving
    rx_w = 0.8
    battery_j = 20000     # optional: it leaves the fleet when spent
    availability = { kind = "random", on_s = 60, off_s = 60 }   # periodic, trace; default always
    radio_mbps = 20       # airtime where the network models no link rate

Agents that no class takes are of the class :data:`HOST`: the machine's own speed, no power
model. What a class means to a run is its mode's to say: a virtual clock runs a local step in
``compute_s / speed`` (``[wireless]``), an emulated agent process stretches each step to
``1 / speed`` times what it took; on a real device (``airgossip agent``) the device is what
it is and the classes are not emulated.

Data only: this module assigns classes to agents and checks the table; nothing here runs.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from airgossip.edge.availability import OnlineSchedule
from airgossip.edge.energy import PowerModel


class Availability(BaseModel):
    """When a class's devices are on (:mod:`airgossip.edge.availability`): ``always``;
    ``periodic``, ``on_s`` on then ``off_s`` off, each device at its own phase; ``random``,
    on and off for exponential times of means ``on_s`` and ``off_s``; ``trace``, off in the
    periods a CSV file lists (``agent,off_from_s,off_until_s``, agents by index), read when
    the scenario is and carried in the run's settings (every process, on any host, gets the
    periods, not the path)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["always", "periodic", "random", "trace"] = "always"
    on_s: float | None = Field(None, gt=0, le=1e7, description="seconds on (a mean, for random)")
    off_s: float | None = Field(None, gt=0, le=1e7, description="seconds off (a mean, for random)")
    file: str | None = Field(None, description="trace: a CSV of agent,off_from_s,off_until_s")
    #: ``trace``: each listed agent's periods off, ``(from_s, until_s)``, read from ``file``.
    off: dict[int, list[tuple[float, float]]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _read_trace(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "trace" and data.get("off") is None:
            file = data.get("file")
            if not isinstance(file, str):
                raise ValueError(
                    "availability 'trace' needs file (a CSV of agent,off_from_s,off_until_s)"
                )
            return {**data, "off": read_off_periods(Path(file))}
        return data

    @model_validator(mode="after")
    def _times_for_the_kind(self) -> Availability:
        timed = self.on_s is not None and self.off_s is not None
        if self.kind in ("periodic", "random") and not timed:
            raise ValueError(f"availability '{self.kind}' needs on_s and off_s (seconds)")
        if self.kind in ("always", "trace") and (self.on_s is not None or self.off_s is not None):
            raise ValueError(f"availability '{self.kind}' takes no on_s or off_s")
        if self.kind != "trace" and (self.file is not None or self.off is not None):
            raise ValueError(f"availability '{self.kind}' takes no file (kind = 'trace' does)")
        return self

    def schedule(self, seed: int, index: int) -> OnlineSchedule | None:
        """Agent ``index``'s schedule in a run of ``seed`` (None: always on)."""
        if self.kind == "trace":
            periods = (self.off or {}).get(index)
            return OnlineSchedule("trace", off=tuple(periods)) if periods else None
        if self.kind == "always" or self.on_s is None or self.off_s is None:
            return None
        return OnlineSchedule(self.kind, self.on_s, self.off_s, seed=seed * 1_000_003 + index)


def read_off_periods(path: Path) -> dict[int, list[tuple[float, float]]]:
    """The periods off of an availability trace: a CSV with the header
    ``agent,off_from_s,off_until_s`` and a row per period (seconds from the run's start);
    ValueError naming the file, the line and what is wrong."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise ValueError(f"availability trace {path}: {err.strerror or err}") from None
    rows = list(csv.reader(lines))
    if not rows or [c.strip() for c in rows[0]] != ["agent", "off_from_s", "off_until_s"]:
        raise ValueError(
            f"availability trace {path}: the first line must be agent,off_from_s,off_until_s"
        )
    periods: dict[int, list[tuple[float, float]]] = {}
    for number, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            agent, begin, end = int(row[0]), float(row[1]), float(row[2])
            if len(row) != 3:
                raise ValueError
        except (ValueError, IndexError):
            raise ValueError(
                f"availability trace {path}, line {number}: expected agent,off_from_s,"
                f"off_until_s (an index and two numbers), got {','.join(row)!r}"
            ) from None
        if agent < 0 or not (math.isfinite(begin) and math.isfinite(end) and 0 <= begin < end):
            raise ValueError(
                f"availability trace {path}, line {number}: an agent index of 0 or more and "
                f"0 <= off_from_s < off_until_s, got {agent}, {begin}, {end}"
            )
        periods.setdefault(agent, []).append((begin, end))
    return periods


class DeviceClass(BaseModel):
    """One ``[[device_classes]]`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    fraction: float | None = Field(
        None, gt=0, le=1, description="share of the fleet in this class, drawn by the run's seed"
    )
    agents: list[int] | None = Field(
        None, description="the agents (indexes from 0) in this class, instead of a fraction"
    )
    speed: float = Field(
        1.0, gt=0, le=1_000,
        description="compute speed relative to the host: a local step takes 1 / speed as long",
    )  # fmt: skip
    compute_w: float = Field(0.0, ge=0, le=10_000, description="power drawn while computing (W)")
    tx_w: float = Field(0.0, ge=0, le=1_000, description="power drawn while transmitting (W)")
    rx_w: float = Field(0.0, ge=0, le=1_000, description="power drawn while receiving (W)")
    availability: Availability = Field(
        default_factory=Availability, description="when the devices are on: always by default"
    )
    wait_timeout_s: float | None = Field(
        None, ge=0, le=600,
        description="this class's longest wait for in-neighbours per round (rounds pace); "
        "default: the run's wait_timeout_s",
    )  # fmt: skip
    battery_j: float | None = Field(
        None, gt=0, le=1e9, description="battery capacity (J); none: mains powered"
    )
    radio_mbps: float | None = Field(
        None, gt=0, le=100_000,
        description="nominal radio rate for airtime where the network models no link rate",
    )  # fmt: skip

    @model_validator(mode="after")
    def _one_way_to_choose(self) -> DeviceClass:
        if (self.fraction is None) == (self.agents is None):
            raise ValueError(
                f"device class '{self.name}': give either fraction (a share of the fleet) or "
                "agents (their indexes), not both and not neither"
            )
        if self.agents is not None:
            if not self.agents:
                raise ValueError(f"device class '{self.name}': agents is empty")
            if len(set(self.agents)) != len(self.agents):
                raise ValueError(f"device class '{self.name}' lists an agent twice")
            if min(self.agents) < 0:
                raise ValueError(f"device class '{self.name}': agent indexes start at 0")
        return self

    def power_model(self) -> PowerModel | None:
        """What an energy ledger needs of this class (None: it draws nothing and has no
        battery, so nothing is accounted)."""
        if not (self.compute_w or self.tx_w or self.rx_w or self.battery_j is not None):
            return None
        radio = None if self.radio_mbps is None else self.radio_mbps * 1e6
        return PowerModel(self.compute_w, self.tx_w, self.rx_w, self.battery_j, radio)

    @property
    def stretch(self) -> float:
        """How many times the host's time one local step of this class takes."""
        return 1.0 / self.speed


#: The class of agents no ``[[device_classes]]`` entry takes: the host's own speed, no power
#: model.
HOST = DeviceClass(name="host", fraction=1.0)


def check_classes(classes: Sequence[DeviceClass], agents: int) -> None:
    """Raise ValueError, saying what is wrong, unless ``classes`` can be assigned to a fleet
    of ``agents``."""
    names = [c.name for c in classes]
    for name in sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"device class '{name}' is declared twice")
    if HOST.name in names:
        raise ValueError(
            f"device class '{HOST.name}' is the class of agents no entry takes; name yours "
            "otherwise"
        )
    taken: dict[int, str] = {}
    for device in classes:
        for index in device.agents or ():
            if index >= agents:
                raise ValueError(
                    f"device class '{device.name}' lists agent {index}, outside the fleet of "
                    f"{agents} agents (0..{agents - 1})"
                )
            if index in taken:
                raise ValueError(
                    f"agent {index} is in two device classes, '{taken[index]}' and '{device.name}'"
                )
            taken[index] = device.name
    share = sum(c.fraction or 0.0 for c in classes)
    wanted = sum(_count(c.fraction, agents) for c in classes if c.fraction is not None)
    if share > 1 + 1e-9 or wanted > agents - len(taken):
        raise ValueError(
            f"device classes take more agents than the fleet has: fractions {share:g} of "
            f"{agents} agents ({wanted}) beside {len(taken)} listed by index"
        )


def assign_classes(classes: Sequence[DeviceClass], agents: int, seed: int) -> list[DeviceClass]:
    """Each agent's class, by index: listed agents first, then each fraction class, in
    order, takes ``round(fraction * agents)`` of the rest in an order drawn by ``seed``; the
    others are :data:`HOST`. The same for every process that asks (a pure function)."""
    check_classes(classes, agents)
    assigned: list[DeviceClass] = [HOST] * agents
    for device in classes:
        for index in device.agents or ():
            assigned[index] = device
    free = [i for i in range(agents) if assigned[i] is HOST]
    random.Random(f"device-classes/{seed}").shuffle(free)
    cursor = 0
    for device in classes:
        if device.fraction is None:
            continue
        count = _count(device.fraction, agents)
        for index in free[cursor : cursor + count]:
            assigned[index] = device
        cursor += count
    return assigned


def _count(fraction: float | None, agents: int) -> int:
    """Agents a class of ``fraction`` takes: the nearest whole number, at least one."""
    return max(1, math.floor((fraction or 0.0) * agents + 0.5))
