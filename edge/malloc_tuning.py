"""glibc's malloc, tuned from Python: the one place that loads the C library to set its
thresholds and arenas (``mallopt``) and to hand freed memory back (``malloc_trim``).

Where the C library is not glibc (macOS, musl's ``mallopt`` does nothing) every call does
nothing and returns False. The values are the callers' to choose, each where it calls and
for what its process allocates: an agent's gRPC transport
(:mod:`airgossip.edge.transport.allocator`), the wireless channel model
(:mod:`airgossip.emulation.channel.heap`), the coordinator (:mod:`airgossip.coordinator.malloc`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from functools import cache

#: ``mallopt`` parameters (``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


class Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later): sizes as ``size_t``."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


@cache
def glibc() -> ctypes.CDLL | None:
    """glibc with ``mallopt`` typed (and ``malloc_trim`` and ``mallinfo2`` where it has
    them); None where the C library is another."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc's alone: musl's mallopt does nothing
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return None
    try:
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.mallinfo2.argtypes, libc.mallinfo2.restype = [], Mallinfo2
    except AttributeError:  # a glibc older than 2.33: no trimming (see heap_trimming)
        pass
    return libc


def mallopt(parameter: int, value: int) -> bool:
    """``mallopt(parameter, value)``; whether glibc took it."""
    libc = glibc()
    return libc is not None and bool(libc.mallopt(parameter, value))


def cap_arenas(count: int) -> bool:
    """At most ``count`` arenas for arenas made from now on (``MALLOC_ARENA_MAX``)."""
    return mallopt(M_ARENA_MAX, count)


_lock = threading.Lock()
#: The thresholds set in this process so far: (mmap, trim).
_kept = (0, 0)


def keep_heap_blocks(*, mmap_threshold: int, trim_threshold: int) -> bool:
    """Serve blocks up to ``mmap_threshold`` bytes from the heap (larger ones are mapped
    and given back when freed) and keep up to ``trim_threshold`` bytes free at the heap's
    top, rather than glibc's adaptive defaults; whether they hold.

    The thresholds only rise: where two parts of one process ask (an agent process with a
    gRPC transport and a wireless channel), the larger of each holds, so that neither's
    blocks go back to being mapped and faulted in afresh. Asking again for no more than
    holds does nothing.
    """
    global _kept
    with _lock:
        wanted = (max(_kept[0], mmap_threshold), max(_kept[1], trim_threshold))
        if wanted == _kept:
            return True
        if not (mallopt(M_MMAP_THRESHOLD, wanted[0]) and mallopt(M_TRIM_THRESHOLD, wanted[1])):
            return False
        _kept = wanted
        return True


def heap_trimming() -> bool:
    """Whether :func:`free_heap_bytes` and :func:`trim_heap` work (glibc 2.33 or later)."""
    libc = glibc()
    return libc is not None and hasattr(libc, "mallinfo2") and hasattr(libc, "malloc_trim")


def free_heap_bytes() -> int:
    """Free bytes in glibc's arenas (``mallinfo2().fordblks``, a walk of the free lists,
    microseconds); 0 without :func:`heap_trimming`."""
    libc = glibc()
    return int(libc.mallinfo2().fordblks) if libc is not None and heap_trimming() else 0


def trim_heap() -> bool:
    """Hand free memory anywhere in the heap back to the kernel (``malloc_trim(0)``, which
    reaches below memory still in use, where glibc's own trimming of the top never does);
    whether it ran."""
    libc = glibc()
    if libc is None or not heap_trimming():
        return False
    libc.malloc_trim(0)
    return True
