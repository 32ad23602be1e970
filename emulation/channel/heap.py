"""The process's allocator told to keep block-sized temporaries between uses (glibc only).

A step of the channel model over the links in range works through its pairs a block at a
time (:data:`~airgossip.emulation.channel.sparse.BLOCK_PAIRS`, 8-16 MB an array), and every block
allocates and frees the same temporaries. glibc's default serves blocks of that size from
``mmap`` until one has been freed, then from the heap, but hands the heap's freed top back
to the kernel past twice that size: the next block faults the same memory in again, 4 kB at
a time. Blocks up to 32 MB from the heap and a heap top kept up to 256 MB leave those pages
mapped for the next block (``docs/performance-history.md``). These are larger than an
agent's transport asks for (4 MB and 32 MB, :mod:`airgossip.edge.transport.allocator`): a step's
temporaries are several arrays of up to 16 MB alive at once, a push's buffers a megabyte
each. Where one process asks for both, the larger hold
(:func:`airgossip.edge.malloc_tuning.keep_heap_blocks`).
"""

from __future__ import annotations

from airgossip.edge.malloc_tuning import keep_heap_blocks

#: Allocations up to this size are served from the heap (glibc's largest threshold).
MMAP_THRESHOLD = 32 << 20
#: Free memory at the heap's top kept for reuse: a step's blocks several times over.
TRIM_THRESHOLD = 256 << 20


def keep_block_temporaries() -> bool:
    """Keep a channel step's block temporaries in the heap; False where the C library is not
    glibc's."""
    return keep_heap_blocks(mmap_threshold=MMAP_THRESHOLD, trim_threshold=TRIM_THRESHOLD)
