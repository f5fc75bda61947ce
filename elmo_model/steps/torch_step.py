"""The LSTM step for inference in plain torch, in place (``lstm_impl="torch"``).

The reference recurrence (``model.ReferenceStep``) with every per-step tensor written
into buffers allocated once per call: fresh multi-MB tensors at every step cost page
faults that took up to a third of the time here. Runs on any device; the CPU's default
is the oneDNN step (``onednn.py``), which shares ``cell_update_``.
"""

from __future__ import annotations

import torch

from elmo_model.model import BiLstmLayer, CharCNN
from elmo_model.pack_plan import LayerInput, PackPlan, float32_out, packed_input


def cell_update_(gates: torch.Tensor, c: torch.Tensor, cell: torch.Tensor,
                 cell_clip: float | None) -> torch.Tensor:
    """The LSTM cell in place, on gates ``[..., 4D]`` (i, f, o, g): ``c = clip(sigmoid(f) c
    + sigmoid(i) tanh(g))`` updates ``c`` ``[..., D]``; returns ``cell = sigmoid(o) tanh(c)``
    written into ``cell``. Clobbers ``gates``."""
    d = c.shape[-1]
    gates[..., : 3 * d].sigmoid_()
    candidate = gates[..., 3 * d :].mul_(2).sigmoid_().mul_(2).sub_(1)  # tanh
    c.mul_(gates[..., d : 2 * d]).addcmul_(gates[..., :d], candidate)
    if cell_clip:
        c.clamp_(-cell_clip, cell_clip)
    return torch.mul(c, 2, out=cell).sigmoid_().mul_(2).sub_(1).mul_(gates[..., 2 * d : 3 * d])


class TorchStep:
    """``LstmStep``: the recurrence in preallocated buffers, both directions per bmm."""

    def __call__(self, layer: BiLstmLayer, x: LayerInput, plan: PackPlan, h: torch.Tensor,
                 c: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = packed_input(x)
        w_in, w_rec, w_proj = layer.matmul_weights(dtype)
        pre = layer.input_projection(x, w_in)  # [2, N, 4D]
        batch, d, p = c.shape[1], c.shape[-1], w_proj.shape[-1]
        low = dtype != torch.float32
        f32 = torch.float32
        out = float32_out((2, x.shape[1], p), x, out)
        c = c.clone()  # updated in place; rows that end keep their final value
        final_h = h.clone()
        flat_gates = pre.new_empty(2 * batch * 4 * d, dtype=f32)
        flat_cell = pre.new_empty(2 * batch * d, dtype=f32)
        flat_h = pre.new_empty(2 * batch * p, dtype=f32)
        if low:
            bias = layer.bias.unsqueeze(1)
            flat_rec = pre.new_empty(2 * batch * 4 * d, dtype=dtype)
            flat_pre = pre.new_empty(2 * batch * 4 * d, dtype=f32)
            flat_cell_low = pre.new_empty(2 * batch * d, dtype=dtype)
            flat_h_low = pre.new_empty(2 * batch * p, dtype=dtype)
        for t, n in enumerate(plan.batch_sizes):
            if n < h.shape[1]:  # sentences of rank >= n just ended: keep their state
                final_h[:, n : h.shape[1]] = h[:, n:]
                h = h[:, :n]
            start = plan.offsets[t]
            gates = flat_gates[: 2 * n * 4 * d].view(2, n, 4 * d)
            if not low:
                torch.baddbmm(pre[:, start : start + n], h, w_rec, out=gates)
            else:
                rec = flat_rec[: 2 * n * 4 * d].view(2, n, 4 * d)
                torch.bmm(h.to(dtype), w_rec, out=rec)
                widened = flat_pre[: 2 * n * 4 * d].view(2, n, 4 * d)
                widened.copy_(pre[:, start : start + n])
                gates.copy_(rec).add_(widened).add_(bias)
            cell = cell_update_(gates, c[:, :n], flat_cell[: 2 * n * d].view(2, n, d),
                                layer.cell_clip)
            h = flat_h[: 2 * n * p].view(2, n, p)
            if not low:
                torch.bmm(cell, w_proj, out=h)
            else:
                cell_low = flat_cell_low[: 2 * n * d].view(2, n, d).copy_(cell)
                h_low = flat_h_low[: 2 * n * p].view(2, n, p)
                h.copy_(torch.bmm(cell_low, w_proj, out=h_low))
            if layer.proj_clip:
                h.clamp_(-layer.proj_clip, layer.proj_clip)
            out[:, start : start + n] = h
        final_h[:, : h.shape[1]] = h
        return out, final_h, c

    def char_cnn_linears(self, char_cnn: CharCNN, dtype: torch.dtype) -> None:
        return None
