"""How the C allocator treats the megabyte buffers a gossip push goes through.

A 40 MB push moves through about a hundred buffers of a megabyte or so on each side: gRPC's
read and write slices, the bytes of each frame. With glibc's defaults, such a buffer is often
mapped fresh from the kernel and unmapped when freed (or the top of the heap is given back
once more than twice the last such size lies free there), so every page of it is faulted in
and zeroed again on the next push: about a quarter of a push's CPU time here (measured with
``perf``: ``docs/performance-history.md``). Pinning the two thresholds at values glibc's own
adaptive rule reaches by itself for buffers of a few megabytes (it goes up to 32 MB and
64 MB) keeps those pages in the heap and reuses them; larger blocks (whole models, tensors)
are still mapped and given back as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading

#: glibc's ``mallopt`` parameters (``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Blocks below this come from the heap (gRPC's slices, a frame's bytes), above it are mapped.
MMAP_THRESHOLD = 4 << 20
#: Free memory kept at the top of the heap before it is given back to the kernel.
TRIM_THRESHOLD = 32 << 20

_lock = threading.Lock()
_settled: bool | None = None


def settle_allocator() -> bool:
    """Set glibc's thresholds once per process (on Linux with glibc; elsewhere nothing).

    Returns whether they are set. Called when a gRPC transport is made, before its threads
    start allocating.
    """
    global _settled
    with _lock:
        if _settled is None:
            _settled = _set_thresholds()
        return _settled


def _set_thresholds() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
