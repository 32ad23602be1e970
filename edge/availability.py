"""When a device is online: a seeded on/off schedule per agent.

A device that is off neither computes, nor sends, nor takes messages in (its peers' pushes
fail as unavailable, and push-sum keeps their mass for the next try); it resumes where it
stopped when it comes back. Three kinds:

* ``always``: never off;
* ``periodic``: ``on_s`` on, then ``off_s`` off, over and over, each agent at its own phase
  (drawn by the seed);
* ``random``: on and off for times drawn from exponential distributions of means ``on_s`` and
  ``off_s`` (on a fraction ``on_s / (on_s + off_s)`` of the time in the long run), starting
  on or off with those odds.
* ``trace``: off in the given periods (``off``: ``(from_s, until_s)`` pairs, as a device
  availability trace records them), on otherwise.

Times are seconds since the agent's run began, on its driver's clock (virtual or wall). A
schedule is a pure function of its seed: every process that builds it gets the same one.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["always", "periodic", "random", "trace"]


@dataclass
class OnlineSchedule:
    """One agent's schedule (see the module docstring)."""

    kind: Kind = "always"
    on_s: float = math.inf
    off_s: float = 0.0
    seed: int = 0
    #: ``trace``: the periods off, as ``(from_s, until_s)`` (merged where they overlap).
    off: tuple[tuple[float, float], ...] = ()
    #: ``random`` and ``trace``: the times the state flips, after a first entry at 0 (the
    #: state at 0 is on iff :attr:`_starts_on`); ``random`` draws them as far as asked.
    _flips: list[float] = field(default_factory=list, repr=False)
    _starts_on: bool = True
    _phase: float = 0.0
    _rng: random.Random | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind == "always":
            return
        if self.kind == "trace":
            merged: list[list[float]] = []
            for begin, end in sorted(self.off):
                if not 0 <= begin < end:
                    raise ValueError(f"an off period must run forwards from 0 s on: {begin}, {end}")
                if merged and begin <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([begin, end])
            self.off = tuple((b, e) for b, e in merged)
            self._flips = [0.0, *(t for period in self.off for t in period)]
            return
        if not (self.on_s > 0 and math.isfinite(self.on_s) and self.off_s > 0):
            raise ValueError(
                f"a {self.kind} schedule needs on_s and off_s above 0 (on_s finite), not "
                f"{self.on_s} and {self.off_s}"
            )
        rng = random.Random(f"availability/{self.seed}")
        if self.kind == "periodic":
            self._phase = rng.uniform(0.0, self.on_s + self.off_s)
        else:
            self._rng = rng
            self._starts_on = rng.random() < self.on_s / (self.on_s + self.off_s)
            self._flips = [0.0]

    def online(self, t: float) -> bool:
        """Whether the device is on at ``t``."""
        if self.kind == "always":
            return True
        if self.kind == "periodic":
            return (t + self._phase) % (self.on_s + self.off_s) < self.on_s
        self._draw_until(t)
        flips = bisect.bisect_right(self._flips, t) - 1  # the state flipped this often by t
        return self._starts_on == (flips % 2 == 0)

    def next_online(self, t: float) -> float:
        """The first time at or after ``t`` the device is on."""
        if self.online(t):
            return t
        if self.kind == "periodic":
            period = self.on_s + self.off_s
            return t + (period - (t + self._phase) % period)
        return self._flips[bisect.bisect_right(self._flips, t)]  # off: the next flip is on

    def _draw_until(self, t: float) -> None:
        """Draw flips until one lies beyond ``t`` (``random``; a trace's are all known)."""
        flips, rng = self._flips, self._rng
        if rng is None:
            return
        while flips[-1] <= t:
            on = self._starts_on == ((len(flips) - 1) % 2 == 0)
            flips.append(flips[-1] + rng.expovariate(1.0 / (self.on_s if on else self.off_s)))
