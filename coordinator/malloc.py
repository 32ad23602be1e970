"""The coordinator process's C allocator: few arenas, so that memory freed stays reusable.

glibc gives each thread that allocates its own arena (up to eight per core) and keeps what a
thread freed in that arena for that thread. A gRPC server hands calls to whichever pool
thread is free, so a burst of large requests (a 1 MB report refused, say) leaves a few MB
behind in every arena it touched: measured, 10,000 hostile reports from 4 client threads
grew the coordinator by 20 MB with the default, 7 MB with two arenas, most of it within
the first thousand. :func:`cap_arenas` asks for two (``mallopt(M_ARENA_MAX)``, what
``MALLOC_ARENA_MAX=2`` does from the environment), for arenas made from then on.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

#: ``M_ARENA_MAX`` of glibc's ``mallopt``.
M_ARENA_MAX = -8


def cap_arenas(count: int = 2) -> bool:
    """Limit glibc's malloc to ``count`` arenas; False where there is no glibc (nothing
    done)."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, count))
