"""Matmuls for CPU inference through oneDNN, on weights reordered once.

torch's CPU ``matmul`` goes to MKL, which copies each call's weight into its own panel
layout before multiplying. The biLM's per-step products multiply a few dozen rows by a
32 MB weight, so that copy, not the arithmetic, set their pace: at 8 rows MKL ran 22
GFLOP/s where oneDNN on a weight reordered once into its blocked layout ran 60, at 32 rows
40-52 against 92 (one thread, the project machine, an AVX-512 AMD EPYC, 2026-11-23). The
large products gain less (the input projection over 1,077 tokens: 77 -> 93 GFLOP/s).
See BENCHMARKS.md for the model's figures.

The ops are torch's own (``torch.ops.mkldnn``, which inductor's CPU backend uses the same
way), but private, so ``onednn_unavailable`` tries them once before the model relies on
them; where they are missing (a torch built without oneDNN) the model runs the torch step.

The model keeps its packings with ``model.derived_weights``, rebuilt when a weight
changes.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def onednn_unavailable(dtype: torch.dtype = torch.float32) -> str | None:
    """Why oneDNN's linear ops cannot run here in ``dtype``; None when they can."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.ones(4, 3, dtype=dtype), 2)
        product = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 3, dtype=dtype), weight,
                                                     None, "none", [], "")
    except (AttributeError, RuntimeError) as error:
        return f"oneDNN's {dtype} linear ops failed here ({type(error).__name__}: {error})"
    if not torch.equal(product.float(), torch.full((2, 4), 3.0)):
        return f"oneDNN's {dtype} linear ops gave a wrong product here"
    return None


class PackedLinear:
    """``x @ weight + bias`` for inference, ``weight`` ``[K, N]`` reordered once.

    ``dtype`` is the matmul's (float32 or bfloat16): the weight and bias are cast to it,
    ``x`` must be in it, and the product comes back in it. ``rows`` is a hint for the
    reorder (the typical number of rows of ``x``); any number of rows works.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.float32, rows: int = 32) -> None:
        self.in_features, self.out_features = weight.shape
        self.dtype = dtype
        transposed = weight.detach().to(dtype).t().contiguous()  # [N, K], nn.Linear's layout
        self.weight = torch.ops.mkldnn._reorder_linear_weight(transposed, rows)
        self.bias = None if bias is None else bias.detach().to(dtype).contiguous()

    def __call__(self, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        """``[M, K] -> [M, N]``; ``add`` (``[M, N]``) is added in the same pass."""
        if x.dtype != self.dtype:
            raise TypeError(f"PackedLinear holds {self.dtype} weights; x is {x.dtype}")
        if add is None:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.weight, self.bias,
                                                      "none", [], "")
        return torch.ops.mkldnn._linear_pointwise.binary(x.contiguous(), add.contiguous(),
                                                         self.weight, self.bias, "add")
