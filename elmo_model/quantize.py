"""The stored int8 rule (``schemas.layers.quantize_int8``, the numpy reference) on torch
tensors, so a GPU quantizes its layers where they are and copies a quarter of the bytes
to the host. The same function runs on CPU tensors and gives the same bytes as the
reference there and on CUDA (tests/pipeline/test_quantize_device.py): a dataset does
not depend on the device that wrote it.

Why each step is written as it is (bit-exactness, not style):

- inputs are widened to float32 first (exact for float16 and bfloat16), as the reference
  does with ``np.asarray(x, np.float32)``;
- ``absmax / 127`` divides by a 0-dim tensor on the vectors' device, never by a Python
  number: CUDA turns division by a host scalar into a multiplication by its reciprocal,
  which rounds differently from IEEE division (the reference);
- ``+ 0.0`` turns the scale of an all-zero vector from -0.0 into +0.0, as the reference;
- ``x / scale`` is a true division per element (IEEE on CPU and on CUDA, where torch is
  built without fast math), ``torch.round`` rounds half to even like ``np.rint``.
"""

from __future__ import annotations

import numpy as np
import torch

from elmo_model.device_copy import TypeLayer0
from schemas.layers import INT8_LIMIT


def quantize_int8_torch(vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., dim]`` floats on any device -> (``[..., dim]`` int8 values, ``[...]``
    float32 scales) on the same device, byte for byte ``schemas.layers.quantize_int8``."""
    if not vectors.is_floating_point():
        raise TypeError(f"quantize_int8_torch takes floating-point vectors, not {vectors.dtype}")
    x = vectors.to(torch.float32)
    absmax = torch.maximum(x.amax(dim=-1), x.amin(dim=-1).neg())
    limit = torch.full((), INT8_LIMIT, dtype=torch.float32, device=x.device)
    scale = absmax.div_(limit).add_(0.0)
    safe = torch.where(scale > 0, scale, torch.ones((), dtype=torch.float32, device=x.device))
    q = x.div(safe.unsqueeze(-1))
    q.round_().clamp_(-INT8_LIMIT, INT8_LIMIT)
    return q.to(torch.int8), scale


def quantize_int8_rows(layers: torch.Tensor, lengths: list[int]
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """A CPU batch's ``[L + 1, N, 2P]`` float32 layers (each sentence's rows between its
    ``<S>`` and ``</S>`` rows) -> its real tokens' (``[L + 1, n, 2P]`` int8 values,
    ``[L + 1, n]`` float32 scales), the same bytes as ``quantize_int8_torch``, by the
    compiled kernel of ``schemas.layers.quantize_int8_into``, straight from where each
    sentence's rows lie: no float copy of them."""
    from schemas import quantize_kernels  # numba: imported when int8 layers are written

    if layers.device.type != "cpu" or layers.dtype != torch.float32 or layers.ndim != 3:
        raise ValueError("quantize_int8_rows takes float32 [L + 1, N, 2P] CPU layers")
    array = layers.numpy()
    n_out, _, dim = array.shape
    values = torch.empty((n_out, sum(lengths), dim), dtype=torch.int8)
    scales = torch.empty((n_out, sum(lengths)), dtype=torch.float32)
    out_values, out_scales = values.numpy(), scales.numpy()
    start = at = 0
    for n in lengths:
        for k in range(n_out):
            quantize_kernels.quantize_rows(array[k, start + 1:start + 1 + n],
                                           out_values[k, at:at + n], out_scales[k, at:at + n], 0)
        start, at = start + n + 2, at + n
    return values, scales


class TypeQuantizer:
    """Layer 0 of a call's distinct tokens, quantized once per token string as batches
    come (``device_copy.TypeLayer0``): layer 0 is ``[x; x]`` of the token's vector, the
    same bytes at every occurrence, so quantizing it for each occurrence (the reference,
    ``quantize_int8_rows`` over all L + 1 layers) repeats the first one's work."""

    def __init__(self) -> None:
        self.row: dict[str, int] = {}  # token -> row, in order of first occurrence
        self.values: list[np.ndarray] = []
        self.scales: list[np.ndarray] = []

    def add(self, tokens: list[str], vectors: torch.Tensor) -> None:
        """A batch's tokens and their float32 CPU vectors ``[N, P]`` (layer 0's halves)."""
        from schemas import quantize_kernels  # numba: imported when int8 layers are written

        at = dict(zip(tokens, range(len(tokens)), strict=True))  # any occurrence will do
        new = [token for token in at if token not in self.row]  # in order of first occurrence
        if not new:
            return
        picked = vectors.index_select(0, torch.tensor([at[token] for token in new]))
        both = torch.cat([picked, picked], dim=1).numpy()  # [t, 2P]: layer 0's rows
        values = np.empty(both.shape, np.int8)
        scales = np.empty(len(both), np.float32)
        quantize_kernels.quantize_rows(both, values, scales, 0)  # quantize_int8_rows' kernel
        for token in new:
            self.row[token] = len(self.row)
        self.values.append(values)
        self.scales.append(scales)

    def result(self) -> TypeLayer0:
        if not self.values:
            return TypeLayer0([], np.zeros((0, 0), np.int8), np.zeros(0, np.float32))
        return TypeLayer0(list(self.row), np.concatenate(self.values),
                          np.concatenate(self.scales))
