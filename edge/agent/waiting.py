"""Saying what an agent waits for: a line every few seconds, with since when.

An agent on a device that waits in silence (for a coordinator that is not there yet, for
its peers, for the fleet to fill) looks hung. :class:`WaitReporter` turns a wait loop's
ticks into one log line every ``every_s`` seconds that says what it waits for, since when
and how it is going.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("airgossip.agent")

#: Seconds between two lines about the same wait.
WAIT_REPORT_S = 5.0


class WaitReporter:
    """One wait: ``tick(detail)`` from the wait loop logs at most every ``every_s`` seconds.

    Parameters
    ----------
    who:
        The agent id the lines start with.
    what:
        What is waited for (``the coordinator at 10.0.0.1:7070``).
    every_s:
        Seconds between lines (default :data:`WAIT_REPORT_S`); the first comes ``every_s``
        after the wait began.
    clock:
        Wall-clock seconds (the lines say since when).
    """

    def __init__(
        self,
        who: str,
        what: str,
        *,
        every_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.who = who
        self.what = what
        self.every_s = WAIT_REPORT_S if every_s is None else every_s
        self.clock = clock
        self.since = clock()
        self._next = self.since + self.every_s
        self.lines = 0

    def due(self) -> bool:
        """Whether the next :meth:`tick` will log (to compute an expensive detail only then)."""
        return self.clock() >= self._next

    def tick(self, detail: str = "") -> bool:
        """Log a line if one is due; return whether it did."""
        now = self.clock()
        if now < self._next:
            return False
        self._next = now + self.every_s
        self.lines += 1
        since = time.strftime("%H:%M:%S", time.localtime(self.since))
        log.info(
            "%s waiting for %s since %s (%.0f s)%s",
            self.who, self.what, since, now - self.since, f": {detail}" if detail else "",
        )  # fmt: skip
        return True

    def elapsed_s(self) -> float:
        return self.clock() - self.since
