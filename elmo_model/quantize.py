"""The stored int8 rule (``schemas.layers``: its docstring states the rule and lists its
variants; ``quantize_int8`` is the numpy reference) on torch tensors, so a GPU quantizes
its layers where they are and copies a quarter of the bytes to the host. The same
function runs on CPU tensors and gives the same bytes as the reference there and on
CUDA (tests/pipeline/test_quantize_device.py): a dataset does not depend on the device
that wrote it.

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
from elmo_model.pack_plan import PackPlan
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


def quantize_int8_packed(packed: list[torch.Tensor], plan: PackPlan, lengths: list[int],
                         values: np.ndarray, scales: np.ndarray, starts: list[int],
                         last_residual: torch.Tensor | None = None) -> None:
    """A CPU batch's real tokens quantized straight from where the biLM left its layers:
    ``packed`` holds per layer a float32 ``[2, N, P]`` tensor in ``plan``'s packed order
    (forward, backward; ``PackedRunner.run``'s buffers with ``PackedLayers``) of sentences
    ``lengths`` long between their ``<S>`` and ``</S>`` rows. Sentence ``i``'s rows of
    layer ``k`` go to ``values[k, starts[i]:starts[i] + lengths[i]]`` (int8 ``[k, T, 2P]``)
    and ``scales[k, ...]`` (float32 ``[k, T]``): the bytes of ``quantize_int8_torch`` on
    the canonical layers ``[h_fwd; h_bwd]``, by ``schemas.quantize_kernels.quantize_halves``,
    with no canonical copy of the layers made first. ``last_residual``: a packed layer
    to add to the last one as it is quantized (``PackedLayers(last_residual=False)``
    left that residual connection to the caller)."""
    from schemas import quantize_kernels  # numba: imported when int8 layers are written

    sizes = np.asarray(lengths, np.int64)
    if plan.n_tokens != int(sizes.sum()) + 2 * len(sizes) or len(starts) != len(sizes):
        raise ValueError(f"the plan has {plan.n_tokens} rows, the sentences {int(sizes.sum())} "
                         f"tokens and {2 * len(sizes)} boundaries, {len(starts)} starts")
    if values.shape[0] != len(packed) or values.dtype != np.int8 or scales.dtype != np.float32:
        raise ValueError("values must be int8 [layers, T, 2P], scales float32 [layers, T]")
    forward_at, backward_at = plan.packed_positions()
    ends = np.cumsum(sizes + 2)  # one past each </S>
    real = np.ones(plan.n_tokens, bool)
    real[ends - 1] = real[ends - sizes - 2] = False  # </S>, <S>
    real = np.flatnonzero(real)
    out_rows = np.repeat(np.asarray(starts, np.int64) - np.cumsum(sizes) + sizes, sizes
                         ) + np.arange(len(real))  # each real token's row in values
    forward_rows, backward_rows = forward_at[real], backward_at[real]
    extra = [] if last_residual is None else [last_residual]
    for layer in [*packed, *extra]:
        if layer.device.type != "cpu" or layer.dtype != torch.float32 or layer.ndim != 3:
            raise ValueError("quantize_int8_packed takes float32 [2, N, P] CPU layers")
    for k, layer in enumerate(packed):
        if k == len(packed) - 1 and last_residual is not None:
            quantize_kernels.quantize_summed_halves(
                layer[0].numpy(), layer[1].numpy(), last_residual[0].numpy(),
                last_residual[1].numpy(), forward_rows, backward_rows, values[k], scales[k],
                out_rows)
        else:
            quantize_kernels.quantize_halves(layer[0].numpy(), layer[1].numpy(), forward_rows,
                                             backward_rows, values[k], scales[k], out_rows)


class TypeQuantizer:
    """Layer 0 of a call's distinct tokens, quantized once per token string as batches
    come (``device_copy.TypeLayer0``): layer 0 is ``[x; x]`` of the token's vector, the
    same bytes at every occurrence, so quantizing it for each occurrence (the reference,
    ``quantize_int8_packed`` over all L + 1 layers) repeats the first one's work."""

    def __init__(self) -> None:
        self.row: dict[str, int] = {}  # token -> row, in order of first occurrence
        self.values: list[np.ndarray] = []
        self.scales: list[np.ndarray] = []

    def add(self, tokens: list[str], vectors: torch.Tensor) -> None:
        """Tokens and their float32 CPU vectors ``[N, P]``, row for row (layer 0's halves)."""
        from schemas import quantize_kernels  # numba: imported when int8 layers are written

        at = dict(zip(tokens, range(len(tokens)), strict=True))  # any occurrence will do
        new = [token for token in at if token not in self.row]  # in order of first occurrence
        if not new:
            return
        rows = np.array([at[token] for token in new], np.int64)
        half = np.ascontiguousarray(vectors.numpy())  # [N, P]
        values = np.empty((len(new), 2 * half.shape[1]), np.int8)
        scales = np.empty(len(new), np.float32)
        # layer 0's row [x; x] quantized from x alone, as the LSTM layers' from their halves
        quantize_kernels.quantize_halves(half, half, rows, rows, values, scales,
                                         np.arange(len(new)))
        for token in new:
            self.row[token] = len(self.row)
        self.values.append(values)
        self.scales.append(scales)

    def result(self) -> TypeLayer0:
        if not self.values:
            return TypeLayer0([], np.zeros((0, 0), np.int8), np.zeros(0, np.float32))
        return TypeLayer0(list(self.row), np.concatenate(self.values),
                          np.concatenate(self.scales))
