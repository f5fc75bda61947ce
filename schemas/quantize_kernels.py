"""The compiled loop of ``schemas.layers.quantize_int8_indices`` (numba, compiled on first
use and cached beside this file), apart so that only writers of int8 layers import numba."""

from __future__ import annotations

import numba
import numpy as np

_ABS_BITS = np.uint32(0x7FFFFFFF)


@numba.njit(nogil=True, cache=True)
def quantize_rows(vectors: np.ndarray, out: np.ndarray, scales: np.ndarray, offset: int
                  ) -> None:
    """``quantize_int8``'s rule, row by row in two passes over each row: ``vectors``
    (float32 ``[n, dim]``, C-contiguous) -> ``out`` (``[n, dim]``: ``q + offset``, int8
    with offset 0 or uint8 dictionary indices with offset 127) and ``scales`` (float32
    ``[n]``).

    The absolute maximum is taken over the bit patterns with the sign cleared, which
    order like the magnitudes for every non-NaN float and reduce as integers (the
    compiler vectorizes that; a float max with NaN rules it does not)."""
    n, dim = vectors.shape
    bits = vectors.reshape(-1).view(np.uint32)
    limit = np.float32(127.0)
    one = np.float32(1.0)
    for r in range(n):
        row_bits = bits[r * dim:(r + 1) * dim]
        top = np.uint32(0)
        for j in range(dim):
            a = row_bits[j] & _ABS_BITS
            top = a if a > top else top
        absmax = np.array([top], np.uint32).view(np.float32)[0]
        scale = absmax / limit
        scales[r] = scale
        safe = scale if scale > 0 else one
        row = vectors[r]
        target = out[r]
        for j in range(dim):
            q = np.rint(row[j] / safe)
            q = min(max(q, -limit), limit)
            target[j] = np.int32(q) + offset
