"""The compiled loops of the int8 rule (``schemas.layers``: its docstring states the rule,
``quantize_int8`` is the reference they are tested equal to), numba, compiled on first use
and cached beside this file; apart so that only writers of int8 layers import numba."""

from __future__ import annotations

import numba
import numpy as np

from schemas.int8_limits import INT8_LIMIT

_ABS_BITS = np.uint32(0x7FFFFFFF)
_LIMIT = np.float32(INT8_LIMIT)


@numba.njit(nogil=True, cache=True, inline="always")
def _absmax_bits(row: np.ndarray) -> np.uint32:
    """The largest magnitude of ``row`` (float32) as a bit pattern: the bit patterns with
    the sign cleared order like the magnitudes for every non-NaN float and reduce as
    integers (the compiler vectorizes that; a float max with NaN rules it does not)."""
    bits = row.view(np.uint32)
    top = np.uint32(0)
    for j in range(bits.shape[0]):
        a = bits[j] & _ABS_BITS
        top = a if a > top else top
    return top


@numba.njit(nogil=True, cache=True, inline="always")
def _scale_of(top: np.uint32) -> np.float32:
    return np.array([top], np.uint32).view(np.float32)[0] / _LIMIT


@numba.njit(nogil=True, cache=True, inline="always")
def _quantize_into(row: np.ndarray, scale: np.float32, target: np.ndarray, offset: int
                   ) -> None:
    """``target[j] = clip(rint(row[j] / scale), -127, 127) + offset``; scale 0 divides by 1."""
    limit = _LIMIT
    safe = scale if scale > 0 else np.float32(1.0)
    for j in range(row.shape[0]):
        q = np.rint(row[j] / safe)
        q = min(max(q, -limit), limit)
        target[j] = np.int32(q) + offset


@numba.njit(nogil=True, cache=True)
def quantize_rows(vectors: np.ndarray, out: np.ndarray, scales: np.ndarray, offset: int
                  ) -> None:
    """``quantize_int8``'s rule, row by row in two passes over each row: ``vectors``
    (float32 ``[n, dim]``, C-contiguous) -> ``out`` (``[n, dim]``: ``q + offset``, int8
    with offset 0 or uint8 dictionary indices with offset ``INDEX_OFFSET``) and ``scales`` (float32
    ``[n]``)."""
    for r in range(vectors.shape[0]):
        scale = _scale_of(_absmax_bits(vectors[r]))
        scales[r] = scale
        _quantize_into(vectors[r], scale, out[r], offset)


@numba.njit(nogil=True, cache=True, inline="always")
def _quantize_pair(a: np.ndarray, b: np.ndarray, out_row: np.ndarray, scales: np.ndarray,
                   at: int) -> None:
    """The vector ``[a; b]`` (float32 halves) quantized into ``out_row`` and ``scales[at]``."""
    top_a, top_b = _absmax_bits(a), _absmax_bits(b)
    scale = _scale_of(top_a if top_a > top_b else top_b)
    scales[at] = scale
    _quantize_into(a, scale, out_row[: a.shape[0]], 0)
    _quantize_into(b, scale, out_row[a.shape[0] :], 0)


@numba.njit(nogil=True, cache=True)
def quantize_halves(first: np.ndarray, second: np.ndarray, first_rows: np.ndarray,
                    second_rows: np.ndarray, out: np.ndarray, scales: np.ndarray,
                    out_rows: np.ndarray) -> None:
    """``quantize_rows`` (offset 0) of the vectors ``[first[first_rows[r]];
    second[second_rows[r]]]`` (float32 ``[N, P]`` each) into row ``out_rows[r]`` of
    ``out`` (int8 ``[n, 2P]``) and ``scales`` (``[n]``), without making them: the same
    bytes, read where the two halves lie (a biLM layer's forward and backward outputs in
    packed order) and written where the caller keeps them."""
    for r in range(first_rows.shape[0]):
        _quantize_pair(first[first_rows[r]], second[second_rows[r]], out[out_rows[r]],
                       scales, out_rows[r])


@numba.njit(nogil=True, cache=True)
def quantize_summed_halves(first: np.ndarray, second: np.ndarray, first_add: np.ndarray,
                           second_add: np.ndarray, first_rows: np.ndarray,
                           second_rows: np.ndarray, out: np.ndarray, scales: np.ndarray,
                           out_rows: np.ndarray) -> None:
    """``quantize_halves`` of ``first + first_add`` and ``second + second_add`` (float32
    sums, as a biLM's residual connection ``y += x`` makes them), without writing the sums
    anywhere: one pass over the layer where adding first would take two more."""
    p = first.shape[1]
    a, b = np.empty(p, np.float32), np.empty(p, np.float32)
    for r in range(first_rows.shape[0]):
        i, k = first_rows[r], second_rows[r]
        for j in range(p):
            a[j] = first[i, j] + first_add[i, j]
            b[j] = second[k, j] + second_add[k, j]
        _quantize_pair(a, b, out[out_rows[r]], scales, out_rows[r])
