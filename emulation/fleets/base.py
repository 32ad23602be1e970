"""The fleet contract: one way of running a fleet's agents, whatever network links them.

A :class:`Fleet` runs every agent of a run to the end and hands back their round records.
One class per mode (``process``, ``inproc``, ``virtual``, ``namespaces``), each registered
by its :attr:`Fleet.mode` in :mod:`airgossip.emulation.fleets.registry`; a mode that cannot serve a
network says so (:meth:`Fleet.refuse`) instead of turning into another mode. A fleet never
asks which network it has: everything about the links comes from the
:class:`~airgossip.node.network.Network` it is handed.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from airgossip.edge.observability.stats import Counters, RoundRecord
from airgossip.emulation.networks import LinkRuntime, Network
from airgossip.scenario.config import RunConfig
from airgossip.scenario.modes import ModeSettings


class FleetError(RuntimeError):
    """A fleet that could not run to the end (an agent crashed, nothing progressed...)."""


@dataclass(frozen=True)
class FleetProgress:
    """A snapshot for progress displays."""

    agents: int
    rounds_total: int
    registered: int = 0
    slowest_round: int = 0
    fastest_round: int = 0
    agents_done: int = 0
    mean_accuracy: float | None = None
    messages_sent: int = 0
    #: Messages that did not arrive (dropped by a link or failed).
    messages_dropped: int = 0
    #: The emulated clock (seconds) of a fleet on a virtual clock.
    emulated_s: float | None = None


ProgressCallback = Callable[[FleetProgress], None]


@dataclass(frozen=True)
class AgentProgress:
    """One agent's latest state, as a progress display sees it."""

    round: int = 0
    final: bool = False
    accuracy: float | None = None
    counters: Counters = field(default_factory=Counters)

    @classmethod
    def of(cls, record: RoundRecord) -> AgentProgress:
        return cls(record.round, record.final, record.metrics.get("accuracy"), record.counters)


def fleet_progress(
    config: RunConfig, latest: Iterable[AgentProgress], registered: int
) -> FleetProgress:
    """The fleet's progress from the latest state of the agents heard from so far."""
    states = list(latest)
    rounds = [s.round for s in states] or [0]
    accuracies = [s.accuracy for s in states if s.accuracy is not None]
    return FleetProgress(
        agents=config.agents,
        rounds_total=config.rounds,
        registered=registered,
        slowest_round=min(rounds) if len(states) == config.agents else 0,
        fastest_round=max(rounds),
        agents_done=sum(1 for s in states if s.final),
        mean_accuracy=float(np.mean(accuracies)) if accuracies else None,
        messages_sent=sum(s.counters.messages_sent for s in states),
        messages_dropped=sum(s.counters.messages_lost for s in states),
    )


@dataclass(frozen=True)
class Launch:
    """Where and how a fleet runs: its output folder and what the launcher asked for.

    Attributes
    ----------
    out_dir:
        The run's output folder (agents' records and logs go under it).
    config_path:
        The launch config every agent process reads (``config.json`` in ``out_dir``).
    on_progress:
        Called with the fleet's progress as it changes.
    coordinator_listen:
        ``host:port`` of an embedded coordinator (fleets that start one).
    coordinator_metrics_listen:
        ``host:port`` of the embedded coordinator's ``/metrics``, ``/sd`` and ``/fleet``.
    on_notice:
        Gets what people running the fleet should know as it becomes known (what a kernel
        could not apply, where the fleet's metrics are), one line each.
    insecure:
        Agents that talk over the network do so in plaintext (default: mutual TLS with a
        throwaway certificate authority in ``out_dir``).
    """

    out_dir: Path
    config_path: Path
    on_progress: ProgressCallback | None = None
    coordinator_listen: str = "127.0.0.1:0"
    coordinator_metrics_listen: str | None = None
    on_notice: Callable[[str], None] | None = None
    insecure: bool = False

    def notice(self, text: str) -> None:
        """Say ``text`` to the launcher (nothing when it does not listen)."""
        if self.on_notice is not None:
            self.on_notice(text)


class ProgressKeeper:
    """Keeps a fleet's latest progress and hands each new one to the launcher's callback."""

    def __init__(self, config: RunConfig, on_progress: ProgressCallback | None) -> None:
        self._on_progress = on_progress
        self._latest = FleetProgress(config.agents, config.rounds)
        self._lock = threading.Lock()

    def update(self, progress: FleetProgress) -> None:
        with self._lock:
            self._latest = progress
        if self._on_progress is not None:
            self._on_progress(progress)

    @property
    def latest(self) -> FleetProgress:
        with self._lock:
            return self._latest


class Fleet(ABC):
    """One way of running a fleet's agents (see the module docstring), the base of every mode.

    Built as ``Fleet(config, network, launch)``; :meth:`run` returns when every agent is
    done, :meth:`stop` (from any thread) makes it return early. What fleets share is written
    once here: progress kept for the launcher (:attr:`keeper`), the scenario's wall clock, a
    :attr:`stopping` event that :meth:`stop` sets, no refusal and no runtime of their own. A
    mode gives its ``mode``, :meth:`run` and :meth:`records`, and overrides
    what differs (a virtual clock, a runtime in this process).
    """

    #: Registry key, the value of ``--mode``.
    mode: ClassVar[str]
    #: Agents run inside this process (the launcher keeps torch to one thread).
    in_process: ClassVar[bool] = False
    #: Agents serve their own ``/metrics`` and an embedded coordinator can serve the
    #: fleet's (``--metrics-port``).
    serves_metrics: ClassVar[bool] = False
    #: The kernel shapes the agents' links (tc, iptables): loss drops packets, which TCP
    #: resends, so agents wait longer for their sends by default.
    links_in_kernel: ClassVar[bool] = False
    #: The agents' ``[[device_classes]]`` speeds are emulated (a virtual clock's step times,
    #: or agent processes' stretched steps); False: the mode has no clock to emulate them on.
    emulates_devices: ClassVar[bool] = False
    #: The mode's own settings table (:mod:`airgossip.scenario.modes`, the same model its
    #: ``MODE_TABLES`` line names), which it reads with
    #: ``config.mode_settings(settings_model)``; None: the mode has none.
    settings_model: ClassVar[type[ModeSettings] | None] = None

    def __init__(self, config: RunConfig, network: Network, launch: Launch | None = None) -> None:
        self.config = config
        self.network = network
        #: Where and how the fleet runs (None: in this process, for checks and notebooks).
        self.launch = launch
        self.keeper = ProgressKeeper(config, launch.on_progress if launch else None)
        self.stopping = threading.Event()
        self._clock = network.wall_clock()

    @classmethod
    def refuse(cls, config: RunConfig, network: Network) -> str | None:
        """Why this mode cannot run ``network`` here (None: it can)."""
        return None

    @abstractmethod
    def run(self) -> None:
        """Run every agent to the end (or until :meth:`stop`)."""

    @abstractmethod
    def records(self) -> dict[str, list[RoundRecord]]:
        """Every agent's round records so far, by agent id."""

    def stop(self) -> None:
        """Make :meth:`run` return soon; safe from any thread."""
        self.stopping.set()

    def progress(self) -> FleetProgress:
        """The latest progress."""
        return self.keeper.latest

    def clock_s(self) -> float:
        """Seconds on the scenario's clock since it started (here: the wall clock)."""
        return self._clock()

    @property
    def runtime(self) -> LinkRuntime | None:
        """The network's runtime when agents run in this process (None here)."""
        return None


def group_records(records: Iterable[RoundRecord]) -> dict[str, list[RoundRecord]]:
    """Records by agent id, in the order they came."""
    out: dict[str, list[RoundRecord]] = {}
    for record in records:
        out.setdefault(record.agent_id, []).append(record)
    return out


def refuse_round_driven(mode: str, network: Network) -> str | None:
    """Why a mode whose agents run on a fixed peer list, without a coordinator, cannot follow
    a graph that changes by round (None: the network's graph does not)."""
    if not network.round_driven:
        return None
    return (
        f"mode '{mode}' cannot switch the gossip graph during a run: its agents run on a "
        "fixed peer list without a coordinator, so nothing sees every agent's rounds to "
        "decide a switch and hand out the next graph (use --mode process, containers, inproc "
        "or virtual for [switching])"
    )
