"""The int8 rule of stored layer vectors (docs/dataset_format.md, "int8 layers"), written
once: every writer quantizes by it and every reader of our own widens by it.

int8, symmetric, one scale per vector (a row of ``[n, dim]``)::

    scale = max_i |x_i| / 127            float32 division; +0.0 for an all-zero vector
    q_i   = rint(x_i / scale)            round half to even, x_i / 1 where scale is 0
    q_i   = clip(q_i, -127, 127)         -128 is never written, so negation is exact
    x_i  ~= q_i * scale                  dequantize: a float32 product

A file stores ``q`` as an int8 list column with its float32 ``<name>_scale`` column; the
assembled int8 pages hold ``q`` as Parquet dictionary indices ``q + 127`` (uint8,
``INDEX_OFFSET``: the dictionary of ``schemas.int8_column_chunk`` is ``-127 .. 127``).

``quantize_int8`` (numpy) is the reference. The fast variants give its bytes exactly,
tested against it bit for bit (tests/pipeline/test_int8_rule.py, test_quantize_device.py):

- ``quantize_int8_into`` / ``quantize_int8_indices``: one compiled pass per row
  (``schemas.quantize_kernels.quantize_rows``) into the caller's buffers, as int8 values
  or as dictionary indices;
- ``schemas.quantize_kernels.quantize_halves`` / ``quantize_summed_halves``: a vector given
  as two halves where they lie (a biLM layer's forward and backward outputs in packed
  order), the second optionally with a residual added as it is read;
- ``elmo_model.quantize.quantize_int8_torch``: torch tensors on any device (a GPU
  quantizes its layers where they are).

Readers widen with ``dequantize_int8`` (numpy) or the SQL of ``dequantize_int8_sql``
(DuckDB views); ``int8_as_indices`` turns stored values into dictionary indices.
"""

from __future__ import annotations

import numpy as np

from schemas.int8_limits import INDEX_OFFSET, INT8_LIMIT


def quantize_int8(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference: ``[n, dim]`` floats -> (``[n, dim]`` int8 values, ``[n]`` float32
    scales)."""
    x = np.asarray(vectors, np.float32)
    # max |x_i| from two reductions, with no [n, dim] temporary: a writer quantizes 16k x
    # 1024 floats a unit, and each fresh 64 MB array is new zeroed pages (BENCHMARKS.md,
    # "fixed mmap threshold"). Adding +0.0 keeps an all-zero vector's scale +0.0.
    absmax = np.maximum(x.max(axis=-1), -x.min(axis=-1))
    scale = (absmax / np.float32(INT8_LIMIT) + np.float32(0)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))
    q = x / safe[..., None]
    np.rint(q, out=q)
    np.clip(q, -INT8_LIMIT, INT8_LIMIT, out=q)
    return q.astype(np.int8), scale


def quantize_int8_indices(vectors: np.ndarray, indices: np.ndarray | None = None,
                          scales: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``quantize_int8`` as Parquet dictionary indices (``q + INDEX_OFFSET``, uint8) and
    scales, written into ``indices`` / ``scales`` when given: one compiled pass per row,
    no temporaries. Equal to ``int8_as_indices`` of the reference for finite input."""
    return _quantize_compiled(vectors, indices, scales, np.uint8, INDEX_OFFSET)


def quantize_int8_into(vectors: np.ndarray, values: np.ndarray | None = None,
                       scales: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``quantize_int8`` (int8 values, float32 scales) in the same compiled pass as
    ``quantize_int8_indices``, written into ``values`` / ``scales`` when given (a
    window of a unit, a batch as it comes), with no float copy made first."""
    return _quantize_compiled(vectors, values, scales, np.int8, 0)


def _quantize_compiled(vectors: np.ndarray, out: np.ndarray | None, scales: np.ndarray | None,
                       dtype: type, offset: int) -> tuple[np.ndarray, np.ndarray]:
    from schemas import quantize_kernels  # numba: imported when int8 layers are written

    x = np.ascontiguousarray(vectors, np.float32)
    if x.ndim != 2:
        raise ValueError("vectors must be [n, dim]")
    if out is None:
        out = np.empty(x.shape, dtype)
    if scales is None:
        scales = np.empty(x.shape[0], np.float32)
    if out.shape != x.shape or out.dtype != dtype or scales.shape != x.shape[:1] \
            or scales.dtype != np.float32:
        raise ValueError(f"out must be {np.dtype(dtype).name} {list(x.shape)} and scales "
                         f"float32 [{x.shape[0]}]")
    quantize_kernels.quantize_rows(x, out, scales, offset)
    return out, scales


def dequantize_int8(values: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``[n, dim]`` int8 values and ``[n]`` scales -> ``[n, dim]`` float32."""
    out = np.asarray(values).astype(np.float32)
    out *= np.asarray(scales, np.float32)[:, None]
    return out


def dequantize_int8_sql(values: str, scale: str) -> str:
    """DuckDB SQL of ``dequantize_int8`` for the list expression ``values`` (TINYINT[])
    and its FLOAT ``scale``: a FLOAT[] of each value times the scale."""
    return f"list_transform({values}, lambda v: v * {scale})"


def int8_as_indices(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Stored int8 values ``q`` as the int8 pages' dictionary indices ``q + 127`` (uint8),
    into ``out`` when given: two's complement wraps ``q`` in ``[-127, 127]`` to ``[0, 254]``."""
    return np.add(np.asarray(values).view(np.uint8), np.uint8(INDEX_OFFSET), out=out)


def halves_equal(vectors: np.ndarray) -> bool:
    """Whether every vector is ``[x; x]`` bitwise (ELMo's layer 0: the token vector for
    both directions), so storing the first half loses nothing."""
    dim = vectors.shape[-1]
    if dim % 2:
        return False
    return bool(np.array_equal(vectors[:, : dim // 2], vectors[:, dim // 2:]))


def cast_floats(vectors: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """``vectors`` as float ``dtype`` (``float16`` or ``float32``), rounded to nearest even
    as ``ndarray.astype`` rounds, written into ``out`` (same shape) when given.

    float32 -> float16 goes through torch: numpy casts to float16 one value at a time,
    an order of magnitude slower, which made opening a compact index of 1M x 1024 vectors
    take seconds (BENCHMARKS.md)."""
    target = np.dtype(dtype)
    src = np.asarray(vectors)
    if out is None:
        out = np.empty(src.shape, target)
    if target == np.float16 and src.dtype == np.float32 and src.size >= _TORCH_CAST_MIN:
        import torch

        torch.from_numpy(out).copy_(torch.from_numpy(np.ascontiguousarray(src)))
    else:
        out[...] = src
    return out


# Below this many values torch's call overhead is more than numpy's cast.
_TORCH_CAST_MIN = 1 << 14


def as_stored(vectors: np.ndarray, dtype: str) -> np.ndarray:
    """``[n, dim]`` floats rounded as a dataset of storage ``dtype`` holds them (float32
    for int8), so that a vector computed now matches a stored one bit for bit."""
    if dtype == "int8":
        return dequantize_int8(*quantize_int8(vectors))
    return cast_floats(vectors, "float16" if dtype == "float16" else "float32")
