"""The coordinator process's C allocator: few arenas, so that memory freed stays reusable.

glibc gives each thread that allocates its own arena (up to eight per core) and keeps what a
thread freed in that arena for that thread. A gRPC server hands calls to whichever pool
thread is free, so a burst of large requests (a 1 MB report refused, say) leaves a few MB
behind in every arena it touched: measured, 10,000 hostile reports from 4 client threads
grew the coordinator by 20 MB with the default, 7 MB with two arenas, most of it within
the first thousand. :func:`cap_arenas` asks for two (``mallopt(M_ARENA_MAX)``, what
``MALLOC_ARENA_MAX=2`` does from the environment), for arenas made from then on.

Unlike an agent (:mod:`airgossip.edge.transport.allocator`) it leaves the mmap and trim thresholds
at glibc's defaults: its requests are small (no push's megabyte buffers to keep), and what it frees
inside the heap is handed back by :class:`HeapTrimmer`. The calls into glibc are
:mod:`airgossip.edge.malloc_tuning`'s.
"""

from __future__ import annotations

import threading

from airgossip.edge import malloc_tuning

#: Arenas the coordinator's allocator keeps (see the module docstring).
ARENAS = 2


def cap_arenas(count: int = ARENAS) -> bool:
    """Limit glibc's malloc to ``count`` arenas; False where there is no glibc (nothing
    done)."""
    return malloc_tuning.cap_arenas(count)


#: Free heap memory, grown by this much since its lowest point, is handed back.
TRIM_SLACK_BYTES = 4 << 20
#: How often the heap's free memory is looked at.
TRIM_INTERVAL_S = 2.0


class HeapTrimmer:
    """Hands memory freed inside the heap back to the kernel (``malloc_trim(0)``).

    Closed connections free their buffers (TLS records, HTTP/2 frames: tens of kB a
    connection) in the middle of the heap, below memory still in use, where glibc's own
    trimming (the top of the heap only) never reaches: measured, 1,000 mutual-TLS
    connections held at once and closed left the coordinator 83 MB larger, and 95 MB after
    a second thousand; ``malloc_trim(0)`` gave back all but 11 MB of it. Every
    ``interval_s`` this looks at the free bytes glibc holds (``mallinfo2``, a walk of the
    free lists, microseconds) and trims once they grew by ``slack_bytes`` since their
    lowest point: a quiet or steady process is never trimmed again and again, and a busy
    one reuses what it freed before it is handed back.
    """

    def __init__(
        self, *, interval_s: float = TRIM_INTERVAL_S, slack_bytes: int = TRIM_SLACK_BYTES
    ) -> None:
        if interval_s <= 0 or slack_bytes < 0:
            raise ValueError(
                f"interval_s must be positive and slack_bytes not negative, "
                f"got {interval_s:g} and {slack_bytes}"
            )
        self.interval_s = interval_s
        self.slack_bytes = slack_bytes
        #: How many times the heap was trimmed (tests, logs).
        self.trims = 0
        self._available = malloc_tuning.heap_trimming()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._low: int | None = None

    @property
    def available(self) -> bool:
        """Whether the C library can do it (glibc 2.33 or later)."""
        return self._available

    def free_bytes(self) -> int:
        """Free bytes in glibc's arenas (``mallinfo2().fordblks``); 0 without glibc."""
        return malloc_tuning.free_heap_bytes()

    def check(self) -> bool:
        """Trim if the free bytes grew by the slack since their lowest point; whether it
        trimmed."""
        if not self._available:
            return False
        free = self.free_bytes()
        if self._low is None or free < self._low:
            self._low = free
        if free - self._low < self.slack_bytes:
            return False
        malloc_tuning.trim_heap()
        self.trims += 1
        self._low = free  # what is free now is handed back: grow past it before the next
        return True

    def start(self) -> HeapTrimmer:
        """Check every ``interval_s`` on a daemon thread (nothing without glibc); self."""
        if self._available and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="heap-trim", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (it checks no more)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check()


def return_freed_memory(
    *, interval_s: float = TRIM_INTERVAL_S, slack_bytes: int = TRIM_SLACK_BYTES
) -> HeapTrimmer:
    """A started :class:`HeapTrimmer` (a coordinator process calls it once, beside
    :func:`cap_arenas`)."""
    return HeapTrimmer(interval_s=interval_s, slack_bytes=slack_bytes).start()
