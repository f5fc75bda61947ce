"""The numeric rules of stored layer vectors (docs/dataset_format.md, "int8 layers").

int8, symmetric, one scale per vector::

    scale = max_i |x_i| / 127          (float32; 0 for an all-zero vector)
    q_i   = round_half_even(x_i / scale), in [-127, 127]
    x_i  ~= q_i * scale

Every writer quantizes with ``quantize_int8`` and every reader of our own widens with
``dequantize_int8``, so the float32 values a reader sees are the same in every path.
"""

from __future__ import annotations

import numpy as np

INT8_LIMIT = 127  # symmetric: -128 is never written, so negation is exact


def quantize_int8(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[n, dim]`` floats -> (``[n, dim]`` int8 values, ``[n]`` float32 scales)."""
    x = np.asarray(vectors, np.float32)
    scale = (np.abs(x).max(axis=-1) / np.float32(INT8_LIMIT)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))
    q = np.rint(x / safe[..., None])
    np.clip(q, -INT8_LIMIT, INT8_LIMIT, out=q)
    return q.astype(np.int8), scale


def dequantize_int8(values: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``[n, dim]`` int8 values and ``[n]`` scales -> ``[n, dim]`` float32."""
    out = np.asarray(values).astype(np.float32)
    out *= np.asarray(scales, np.float32)[:, None]
    return out


def halves_equal(vectors: np.ndarray) -> bool:
    """Whether every vector is ``[x; x]`` bitwise (ELMo's layer 0: the token vector for
    both directions), so storing the first half loses nothing."""
    dim = vectors.shape[-1]
    if dim % 2:
        return False
    return bool(np.array_equal(vectors[:, : dim // 2], vectors[:, dim // 2:]))


def as_stored(vectors: np.ndarray, dtype: str) -> np.ndarray:
    """``[n, dim]`` floats rounded as a dataset of storage ``dtype`` holds them (float32
    for int8), so that a vector computed now matches a stored one bit for bit."""
    if dtype == "int8":
        return dequantize_int8(*quantize_int8(vectors))
    return np.asarray(vectors).astype(np.float16 if dtype == "float16" else np.float32)
