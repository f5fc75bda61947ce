"""A worker process's allocator setting, shared by every executor and stage process."""

from __future__ import annotations

import ctypes

# glibc serves allocations from this size up with their own mmap, returned whole when
# freed. Left alone it raises the threshold (up to 32 MiB) each time such a block is
# freed, after which an item's multi-MB buffers (Arrow columns, numpy and torch arrays)
# come from the heap and fragment it: a worker's peak then climbed with every new kind
# of text it met (BENCHMARKS.md, pipeline section). Fixed at 1 MiB rather than glibc's
# starting 128 KiB: the model's per-chunk and per-step temporaries (char CNN conv outputs,
# a time step's gates) are mostly below it and are reused from the heap instead of being
# fresh zeroed pages on every call; half the page faults, the same flat peak from 3M to
# 42M tokens (BENCHMARKS.md, "The mmap threshold at 1 MiB").
MMAP_THRESHOLD_BYTES = 1 << 20
# Setting the mmap threshold also freezes glibc's trim threshold at 128 KiB: each time the
# top of the heap had that much free, it went back to the kernel, and the next batch's
# sub-MiB temporaries (a layer's [2, B, P] states, their copies) came back as fresh zeroed
# pages, ~0.3 faults a token at 3 x 1024. Free heap up to this size is kept instead.
TRIM_THRESHOLD_BYTES = 32 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def fix_mmap_threshold() -> bool:
    """Keep this process's large allocations on their own mmap (see
    ``MMAP_THRESHOLD_BYTES``) and its freed heap for reuse (``TRIM_THRESHOLD_BYTES``);
    False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
