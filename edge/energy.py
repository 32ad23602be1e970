"""What an agent spends: an energy ledger of compute and radio joules, and the battery left.

The model is the one wireless-learning studies use (compute energy from the time spent
computing and the power drawn meanwhile; radio energy from transmit and receive power and
airtime):

    compute J = compute_w * seconds computing
    radio J   = tx_w * airtime of what it sent + rx_w * airtime of what it received
    airtime   = wire bytes * 8 / the link's rate

The link's rate is what the network models for it at that moment (a wireless channel's
rate, a static link's bandwidth: ``rate_of``), else the device's nominal ``radio_bps``;
with neither, a message costs no radio energy: the ledger says so in its agent's log, once,
and in :attr:`radio_known`.
Seconds computing are the emulated ones, which the driver passes on (a virtual clock's
step, an agent process's stretched step): the ledger keeps no clock.

An agent with a battery is *depleted* once it has spent the battery's joules; what that
does to the agent is its driver's to decide (it leaves, as a dead device does).
Thread-safe: sends and receives are counted from the transport's threads.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: The rate (bit/s) of the link ``sender -> receiver`` now, or None where the network models
#: none.
RateOf = Callable[[str, str], float | None]


@dataclass(frozen=True)
class PowerModel:
    """A device's power draw (W), battery (J; None: mains) and nominal radio rate (bit/s;
    None: the network's links only)."""

    compute_w: float = 0.0
    tx_w: float = 0.0
    rx_w: float = 0.0
    battery_j: float | None = None
    radio_bps: float | None = None

    def __post_init__(self) -> None:
        for name in ("compute_w", "tx_w", "rx_w"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite power of 0 W or more, not {value}")
        if self.battery_j is not None and not self.battery_j > 0:
            raise ValueError(f"battery_j must be positive, not {self.battery_j}")
        if self.radio_bps is not None and not self.radio_bps > 0:
            raise ValueError(f"radio_bps must be positive, not {self.radio_bps}")


class EnergyLedger:
    """One agent's joules so far (see the module docstring)."""

    def __init__(self, agent_id: str, power: PowerModel, rate_of: RateOf | None = None) -> None:
        self.agent_id = agent_id
        self.power = power
        self.rate_of = rate_of
        self.compute_j = 0.0
        self.tx_j = 0.0
        self.rx_j = 0.0
        #: Every message so far had a rate to charge its airtime at.
        self.radio_known = True
        self._lock = threading.Lock()

    def computed(self, seconds: float) -> None:
        """``seconds`` of computing (emulated), at the device's compute power."""
        with self._lock:
            self.compute_j += self.power.compute_w * seconds

    def sent(self, peer: str, nbytes: int) -> None:
        """A message of ``nbytes`` on the wire to ``peer`` (delivered or not: the radio was
        on either way)."""
        if self.power.tx_w > 0:
            airtime = self._airtime(self.agent_id, peer, nbytes)
            with self._lock:
                self.tx_j += self.power.tx_w * airtime

    def received(self, peer: str, nbytes: int) -> None:
        """A message of ``nbytes`` from ``peer``."""
        if self.power.rx_w > 0:
            airtime = self._airtime(peer, self.agent_id, nbytes)
            with self._lock:
                self.rx_j += self.power.rx_w * airtime

    def _airtime(self, sender: str, receiver: str, nbytes: int) -> float:
        rate = self.rate_of(sender, receiver) if self.rate_of is not None else None
        if rate is None or not rate > 0:
            rate = self.power.radio_bps
        if rate is None:
            if self.radio_known:
                log.warning(
                    "%s: no rate is known for the link %s -> %s, and its device class gives "
                    "no radio_mbps: its messages cost no radio energy",
                    self.agent_id, sender, receiver,
                )  # fmt: skip
            self.radio_known = False
            return 0.0
        return nbytes * 8.0 / rate

    @property
    def total_j(self) -> float:
        return self.compute_j + self.tx_j + self.rx_j

    @property
    def battery_left_j(self) -> float | None:
        """Joules left in the battery (None: no battery)."""
        battery = self.power.battery_j
        return None if battery is None else max(0.0, battery - self.total_j)

    @property
    def depleted(self) -> bool:
        """The battery is spent."""
        left = self.battery_left_j
        return left is not None and left <= 0.0

    def figures(self) -> dict[str, float]:
        """What a round record carries: ``energy_j`` (all), ``compute_j``, ``radio_j`` and,
        with a battery, ``battery_left_j``."""
        with self._lock:
            figures = {
                "energy_j": self.total_j,
                "compute_j": self.compute_j,
                "radio_j": self.tx_j + self.rx_j,
            }
        left = self.battery_left_j
        if left is not None:
            figures["battery_left_j"] = left
        return figures
