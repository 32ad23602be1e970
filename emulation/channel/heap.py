"""The process's allocator told to keep block-sized temporaries between uses (glibc only).

A step of the channel model over the links in range works through its pairs a block at a
time (:data:`~emulation.channel.sparse.BLOCK_PAIRS`, 8-16 MB an array), and every block
allocates and frees the same temporaries. glibc's default serves blocks of that size from
``mmap`` until one has been freed, then from the heap, but hands the heap's freed top back
to the kernel past twice that size: the next block faults the same memory in again, 4 kB at a
time. A fixed threshold (blocks up to 32 MB from the heap, larger arrays from ``mmap`` and
given back when freed) and a heap top kept up to 256 MB leave those pages mapped for the
next block: a loop of such blocks went from 2.0 s to 0.77 s of kernel time, a 10,000-node
step in lte-urban's 2 km square by about 0.5-1 s of its 4.5-5.6 s when measured (the rest
was the step's whole-size arrays, from ``mmap``; since, the step writes into arrays sized
once and reuses the scan's, see docs/performance-history.md, issue 18's eighth pass).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Allocations up to this size are served from the heap (glibc's largest threshold).
MMAP_THRESHOLD = 32 << 20
#: Free memory at the heap's top kept for reuse.
TRIM_THRESHOLD = 256 << 20

_applied = False


def keep_block_temporaries() -> bool:
    """Set the thresholds above (once a process); False where the C library is not
    glibc's."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _applied
