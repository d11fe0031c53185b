"""Keep freed memory returnable to the OS (glibc malloc), so peak RSS is what a step needs at once.

glibc raises its mmap threshold each time a large block is freed (up to 32 MB). Past that point the
blocks of tens of MB that a large-vocabulary step allocates and frees over and over (one chunk of
`[rows, vocab]` logits, its softmax temporaries) are served from the heap, fragment it, and are never
returned: measured on a 151,936-vocabulary head, 162 chunks of 33 MB each grew RSS to 5.4 GB, the
size of the whole `[B, T, V]` tensor the chunking exists to avoid (415 MB with this fix, and faster).
Fixing the threshold sends every block above it to mmap, unmapped when freed. Smaller blocks (all of
the tiny model's) are unaffected. `MALLOC_MMAP_THRESHOLD_=16777216` in the environment does the same.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
THRESHOLD_BYTES = 16 << 20


def return_large_blocks_to_os(threshold_bytes: int = THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold_bytes`; False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes))
    except (OSError, AttributeError):  # musl, macOS: no mallopt, or another allocator
        return False
