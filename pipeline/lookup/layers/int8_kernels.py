"""The compiled loops of ``pipeline.lookup.layers.int8`` (numba, compiled on first use
and cached beside this file), apart so that only readers of int8 files import numba."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def decode_hybrid(data: np.ndarray, bit_width: int, dictionary: np.ndarray, out: np.ndarray,
                  count: int) -> int:
    """Decode ``count`` dictionary indices of an RLE / bit-packed hybrid run sequence (bit
    width <= 8) from ``data`` and write their ``dictionary`` values (int8, 256 entries)
    into ``out``; returns how many were decoded (less: malformed input)."""
    filled = 0
    pos = 0
    mask = (1 << bit_width) - 1
    n = len(data)
    while filled < count and pos < n:
        header = 0
        shift = 0
        while pos < n:
            byte = data[pos]
            pos += 1
            header |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        if header & 1:  # bit-packed: header >> 1 groups of 8 values
            values = (header >> 1) * 8
            size = (header >> 1) * bit_width
            if pos + size > n:
                return filled
            take = min(values, count - filled)
            if bit_width == 8:
                run_out = out[filled:filled + take]
                run_in = data[pos:pos + take]
                for i in range(take):
                    run_out[i] = dictionary[run_in[i]]
            else:
                for i in range(take):
                    bit = i * bit_width
                    at = pos + (bit >> 3)
                    word = data[at] >> (bit & 7)
                    if (bit & 7) + bit_width > 8:
                        word |= data[at + 1] << (8 - (bit & 7))
                    out[filled + i] = dictionary[word & mask]
            pos += size
            filled += take
        else:  # a run of one repeated value
            repeat = header >> 1
            if bit_width and pos >= n:
                return filled
            value = data[pos] & mask if bit_width else 0
            pos += (bit_width + 7) >> 3
            take = min(repeat, count - filled)
            out[filled:filled + take] = dictionary[value]
            filled += take
    return filled


@numba.njit(nogil=True, cache=True)
def mix_rows(out: np.ndarray, dense: np.ndarray, dense_scales: np.ndarray,
              dense_rows: np.ndarray, dense_weight: float, values: np.ndarray,
              scales: np.ndarray, weights: np.ndarray) -> None:
    """``out[r] = sum_j w_j * layer_j[r]`` row by row, in ``accumulate``'s order.

    ``dense`` (int8 ``[types, dim]`` and its ``dense_scales``, gathered by
    ``dense_rows``; no rows: none) is the first layer when given; then int8 layer ``j``:
    ``values[j, r]`` and ``scales[j, r]``. Each value is ``float32(q) * scale``
    (``dequantize_int8``) times its weight; a weight of exactly 1 is not applied
    (``x * 1 == x``), as in ``accumulate``."""
    rows = out.shape[0]
    has_dense = dense.shape[0] > 0
    for r in range(rows):
        row = out[r]
        if has_dense:
            t = dense_rows[r]
            _scaled(row, dense[t], dense_scales[t], dense_weight, True)
        for j in range(values.shape[0]):
            _scaled(row, values[j, r], scales[j, r], weights[j], j == 0 and not has_dense)


@numba.njit(nogil=True, cache=True, inline="always")
def _scaled(row: np.ndarray, q: np.ndarray, scale: float, weight: float, first: bool) -> None:
    """``row = float32(q) * scale * weight`` (first layer) or ``row += ...``."""
    dim = row.shape[0]
    if weight != 1.0:
        if first:
            for i in range(dim):
                row[i] = (np.float32(q[i]) * scale) * weight
        else:
            for i in range(dim):
                row[i] += (np.float32(q[i]) * scale) * weight
    elif first:
        for i in range(dim):
            row[i] = np.float32(q[i]) * scale
    else:
        for i in range(dim):
            row[i] += np.float32(q[i]) * scale
