"""How often one identity may call the coordinator: a token bucket per identity and method.

An agent heartbeats once an interval and reports once or a few times after each heartbeat
(more while it catches up on a backlog); nothing honest comes near the rates below. What a
caller sends beyond them is refused with ``RESOURCE_EXHAUSTED`` before it touches the
membership's lock or the database, so that one identity cannot monopolise the coordinator
(without a limit, 1,649 heartbeats a second from one identity were all taken).

The buckets are keyed by the caller's identity (its certificate's with TLS, the id it gives
without); at most :data:`MAX_IDENTITIES` are remembered, the least recently seen forgotten
first, so that callers naming ever new ids cannot grow the coordinator's memory.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: Identities whose buckets are remembered at once.
MAX_IDENTITIES = 4096


@dataclass(frozen=True)
class RateLimit:
    """Calls per second on average, and how many may come at once."""

    per_second: float
    burst: int

    def __post_init__(self) -> None:
        if not self.per_second > 0 or self.burst < 1:
            raise ValueError(f"a rate limit needs a positive rate and burst, got {self}")


def call_limits(heartbeat_interval_s: float) -> dict[str, RateLimit]:
    """The limit of each coordinator method, for agents that heartbeat every
    ``heartbeat_interval_s`` seconds.

    Heartbeats: four times the agent's own rate, at least 2 a second, 10 at once. Reports:
    several per heartbeat and a backlog sent at once (10,000 queued reports are 40 calls or
    more), so at least 20 a second and 100 at once. Registrations, run queries and watches:
    what a restarting or waiting agent does, with room to spare.
    """
    beats = max(2.0, 4.0 / heartbeat_interval_s)
    return {
        "Heartbeat": RateLimit(beats, 10),
        "Report": RateLimit(max(20.0, 8.0 / heartbeat_interval_s), 100),
        "Register": RateLimit(2.0, 10),
        "GetRun": RateLimit(10.0, 30),
        "WatchNeighbours": RateLimit(2.0, 10),
        "Leave": RateLimit(2.0, 10),
    }


class RateLimiter:
    """Token buckets per (identity, method); thread-safe.

    Parameters
    ----------
    limits:
        The limit of each method; methods not named are not limited.
    clock:
        Monotonic seconds.
    """

    def __init__(
        self,
        limits: Mapping[str, RateLimit],
        *,
        max_identities: int = MAX_IDENTITIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = dict(limits)
        self.max_identities = max_identities
        self.clock = clock
        self._lock = threading.Lock()
        #: (identity, method) -> (tokens, time they were counted), least recent first.
        self._buckets: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()

    def allow(self, identity: str, method: str) -> bool:
        """Take one call of ``method`` from ``identity``'s bucket; False when it is empty."""
        limit = self.limits.get(method)
        if limit is None:
            return True
        key = (identity, method)
        now = self.clock()
        with self._lock:
            tokens, then = self._buckets.pop(key, (float(limit.burst), now))
            tokens = min(float(limit.burst), tokens + (now - then) * limit.per_second)
            allowed = tokens >= 1.0
            self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
            while len(self._buckets) > self.max_identities * max(1, len(self.limits)):
                self._buckets.popitem(last=False)
            return allowed

    def wait_s(self, method: str) -> float:
        """How long a refused caller should wait: the time one call's token takes."""
        return 1.0 / self.limits[method].per_second

    def describe(self, method: str) -> str:
        """The limit of ``method`` in words, for a refusal."""
        limit = self.limits[method]
        return f"at most {limit.per_second:g} {method} calls a second ({limit.burst} at once)"

    def tracked(self) -> int:
        """Buckets held now (bounded by ``max_identities`` times the methods limited)."""
        with self._lock:
            return len(self._buckets)
