"""How the C allocator treats the megabyte buffers a gossip push goes through.

A 40 MB push moves through about a hundred buffers of a megabyte or so on each side: gRPC's
read and write slices, the bytes of each frame. With glibc's defaults, such a buffer is often
mapped fresh from the kernel and unmapped when freed (or the top of the heap is given back
once more than twice the last such size lies free there), so every page of it is faulted in
and zeroed again on the next push: about a quarter of a push's CPU time
(``docs/performance-history.md``). Pinning the two thresholds at values glibc's own adaptive
rule reaches by itself for buffers of a few megabytes keeps those pages in the heap and
reuses them; larger blocks (whole models, tensors) are still mapped and given back as
before, so an agent holds no more than its buffers' worth beyond its models.
"""

from __future__ import annotations

from airgossip.edge.malloc_tuning import keep_heap_blocks

#: Blocks below this come from the heap (gRPC's slices, a frame's bytes), above it are mapped.
MMAP_THRESHOLD = 4 << 20
#: Free memory kept at the top of the heap before it is given back to the kernel: a push's
#: buffers several times over, not a channel model's blocks (see airgossip.emulation.channel.heap).
TRIM_THRESHOLD = 32 << 20


def settle_allocator() -> bool:
    """Keep a push's buffers in the heap (glibc only; elsewhere nothing); whether that holds.
    Called when a gRPC transport is made, before its threads start allocating."""
    return keep_heap_blocks(mmap_threshold=MMAP_THRESHOLD, trim_threshold=TRIM_THRESHOLD)
