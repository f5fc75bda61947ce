"""The biLM's LSTM step as two fused Triton kernels, and the time loops that launch them.

One step of one layer, both directions at once (see ``model.BiLstmLayer``)::

    rec  = h_in @ W_rec                                   cuBLAS  [2, n, 4D]  matmul dtype
    cell = gates_cell_kernel(rec, pre, bias, c)           Triton  [2, n, D]   matmul dtype
           (adds bias, gates, updates and clips c in place: c stays float32)
    proj = cell @ W_proj                                  cuBLAS  [2, n, P]   matmul dtype
    projection_clip_kernel(proj) -> out slice (fp32), h state (fp32), next h_in (matmul dtype)

The unfused step makes ~12 passes over the ``[2, n, 4D]`` float32 gates; here the gates
are read once, in the matmul's dtype, and the gate math runs in float32 registers.

Two time loops share those kernels: ``packed_steps`` here, over the packed layout of
``PackPlan`` (only real tokens at each step), and ``fused_graphs.PaddedRun.steps``, over a
fixed ``[steps, batch]`` grid captured as CUDA graphs; ``fused_graphs.FusedStep`` is the
``LstmStep`` that runs one or the other.

The projection matmul stays cuBLAS (its clip is the second kernel's first operation): a
Triton matmul with the clip as epilogue would save one small pass over ``[2, n, P]``.

Importing this module imports triton; ``lstm_steps`` imports it only when the fused step
is chosen. The same launches run on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1`` set before triton is imported), which is how the tests check them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from elmo_model.pack_plan import float32_out

# Both kernels work on a tile of ROWS rows x COLS columns of one direction; program axis 0
# walks (direction, row tile), axis 1 column tiles. tanh is written as 2 sigmoid(2x) - 1,
# the reference step's formula, so both round alike; sigmoid and cdiv are spelled out
# (what tl.sigmoid and tl.cdiv compile to) because the interpreter runs every call of a
# jit helper through a slow patching step.


@triton.jit(do_not_specialize=["step"])
def _gates_cell_kernel(
    rec_ptr, pre_ptr, bias_ptr, c_ptr, cell_ptr, lengths_ptr,
    n_rows, d, step,
    rec_dir_stride, rec_row_stride,
    pre_dir_stride, pre_row_stride,
    c_dir_stride, c_row_stride,
    cell_dir_stride, cell_row_stride,
    cell_clip,
    CLIP_CELL: tl.constexpr, MASKED: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
):
    """gates = rec + pre + bias (order i, f, o, g); c = clip(f c + i g); cell = o tanh(c)."""
    row_tiles = (n_rows + ROWS - 1) // ROWS
    direction = (tl.program_id(0) // row_tiles).to(tl.int64)
    rows = ((tl.program_id(0) % row_tiles) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols = (tl.program_id(1) * COLS + tl.arange(0, COLS))[None, :]
    valid = (rows < n_rows) & (cols < d)
    rec = rec_ptr + direction * rec_dir_stride + rows * rec_row_stride + cols
    pre = pre_ptr + direction * pre_dir_stride + rows * pre_row_stride + cols
    bias = bias_ptr + direction * 4 * d + cols
    col_valid = cols < d
    z_i = (tl.load(rec, mask=valid).to(tl.float32) + tl.load(pre, mask=valid).to(tl.float32)
           + tl.load(bias, mask=col_valid))
    z_f = (tl.load(rec + d, mask=valid).to(tl.float32)
           + tl.load(pre + d, mask=valid).to(tl.float32) + tl.load(bias + d, mask=col_valid))
    z_o = (tl.load(rec + 2 * d, mask=valid).to(tl.float32)
           + tl.load(pre + 2 * d, mask=valid).to(tl.float32)
           + tl.load(bias + 2 * d, mask=col_valid))
    z_g = (tl.load(rec + 3 * d, mask=valid).to(tl.float32)
           + tl.load(pre + 3 * d, mask=valid).to(tl.float32)
           + tl.load(bias + 3 * d, mask=col_valid))
    c_at = c_ptr + direction * c_dir_stride + rows * c_row_stride + cols
    c_prev = tl.load(c_at, mask=valid)
    candidate = 2.0 * 1.0 / (1.0 + tl.exp(-2.0 * z_g)) - 1.0
    c_new = 1.0 / (1.0 + tl.exp(-z_f)) * c_prev + 1.0 / (1.0 + tl.exp(-z_i)) * candidate
    if CLIP_CELL:
        c_new = tl.minimum(tl.maximum(c_new, -cell_clip), cell_clip)
    if MASKED:  # rows past their length keep their state
        length = tl.load(lengths_ptr + rows, mask=rows < n_rows, other=0)
        c_new = tl.where(step < length, c_new, c_prev)
    tl.store(c_at, c_new, mask=valid)
    cell = 1.0 / (1.0 + tl.exp(-z_o)) * (2.0 * 1.0 / (1.0 + tl.exp(-2.0 * c_new)) - 1.0)
    cell_at = cell_ptr + direction * cell_dir_stride + rows * cell_row_stride + cols
    tl.store(cell_at, cell.to(cell_ptr.dtype.element_ty), mask=valid)


@triton.jit(do_not_specialize=["step"])
def _projection_clip_kernel(
    proj_ptr, out_ptr, h_ptr, h_in_ptr, lengths_ptr,
    n_rows, p, step,
    proj_dir_stride, proj_row_stride,
    out_dir_stride, out_row_stride,
    h_dir_stride, h_row_stride,
    proj_clip,
    CLIP_PROJ: tl.constexpr, WRITE_H_IN: tl.constexpr, MASKED: tl.constexpr,
    ROWS: tl.constexpr, COLS: tl.constexpr,
):
    """Clip the projected output; write the output (fp32), the h state (fp32) and, when
    the matmuls run in low precision, the next step's matmul input ``h_in``."""
    row_tiles = (n_rows + ROWS - 1) // ROWS
    direction = (tl.program_id(0) // row_tiles).to(tl.int64)
    rows = ((tl.program_id(0) % row_tiles) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols = (tl.program_id(1) * COLS + tl.arange(0, COLS))[None, :]
    valid = (rows < n_rows) & (cols < p)
    proj_at = proj_ptr + direction * proj_dir_stride + rows * proj_row_stride + cols
    h = tl.load(proj_at, mask=valid).to(tl.float32)
    if CLIP_PROJ:
        h = tl.minimum(tl.maximum(h, -proj_clip), proj_clip)
    out_at = out_ptr + direction * out_dir_stride + rows * out_row_stride + cols
    tl.store(out_at, h, mask=valid)
    h_at = h_ptr + direction * h_dir_stride + rows * h_row_stride + cols
    if MASKED:
        length = tl.load(lengths_ptr + rows, mask=rows < n_rows, other=0)
        h = tl.where(step < length, h, tl.load(h_at, mask=valid))
    tl.store(h_at, h, mask=valid)
    if WRITE_H_IN:
        h_in_at = h_in_ptr + direction * h_dir_stride + rows * h_row_stride + cols
        tl.store(h_in_at, h.to(h_in_ptr.dtype.element_ty), mask=valid)


def _tiles(n_rows: int, width: int) -> tuple[int, int]:
    """(ROWS, COLS) of a tile: up to 256 columns and 2,048 elements; ROWS takes few
    values (1, 2, 4, 8), so few kernel variants get compiled."""
    cols = min(256, triton.next_power_of_2(width))
    rows = min(8, triton.next_power_of_2(n_rows), max(1, 2048 // cols))
    return rows, cols


@dataclass
class StepWeights:
    """What one layer's fused step reads: weights in the matmul dtype, bias float32."""

    w_rec: torch.Tensor  # [2, P, 4D]
    w_proj: torch.Tensor  # [2, D, P]
    bias: torch.Tensor  # [2, 4D] float32, contiguous
    cell_clip: float | None
    proj_clip: float | None

    @property
    def dtype(self) -> torch.dtype:
        return self.w_rec.dtype


def fused_step(
    weights: StepWeights,
    pre: torch.Tensor,
    h: torch.Tensor,
    h_in: torch.Tensor,
    c: torch.Tensor,
    out: torch.Tensor,
    rec: torch.Tensor,
    cell: torch.Tensor,
    proj: torch.Tensor,
    lengths: torch.Tensor | None = None,
    step: int = 0,
) -> None:
    """One LSTM step for the n rows of ``pre``, in place.

    pre ``[2, n, 4D]`` input projection without bias; h ``[2, >=n, P]`` fp32 state, read
    through ``h_in`` (the same tensor in fp32, its matmul-dtype copy otherwise); c
    ``[2, >=n, D]`` fp32; out ``[2, n, P]`` fp32; rec, cell, proj: contiguous work buffers
    ``[2, n, 4D]``, ``[2, n, D]``, ``[2, n, P]`` in the matmul dtype. With ``lengths``
    (``[n]`` int32), rows with ``lengths <= step`` keep their h and c.
    """
    n, d, p = pre.shape[1], c.shape[-1], h.shape[-1]
    assert h_in.stride() == h.stride(), "the kernel writes h_in with h's strides"
    torch.bmm(h_in[:, :n], weights.w_rec, out=rec)
    masked = lengths is not None
    lengths_arg = lengths if masked else c  # never read unless MASKED
    rows, cols = _tiles(n, d)
    _gates_cell_kernel[(2 * triton.cdiv(n, rows), triton.cdiv(d, cols))](
        rec, pre, weights.bias, c, cell, lengths_arg,
        n, d, step,
        rec.stride(0), rec.stride(1),
        pre.stride(0), pre.stride(1),
        c.stride(0), c.stride(1),
        cell.stride(0), cell.stride(1),
        float(weights.cell_clip or 0.0),
        CLIP_CELL=bool(weights.cell_clip), MASKED=masked, ROWS=rows, COLS=cols,
    )
    torch.bmm(cell, weights.w_proj, out=proj)
    rows, cols = _tiles(n, p)
    _projection_clip_kernel[(2 * triton.cdiv(n, rows), triton.cdiv(p, cols))](
        proj, out, h, h_in, lengths_arg,
        n, p, step,
        proj.stride(0), proj.stride(1),
        out.stride(0), out.stride(1),
        h.stride(0), h.stride(1),
        float(weights.proj_clip or 0.0),
        CLIP_PROJ=bool(weights.proj_clip), WRITE_H_IN=h_in is not h, MASKED=masked,
        ROWS=rows, COLS=cols,
    )


class Buffers:
    """Flat work buffers reused across steps and calls, viewed at each step's shape."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._flat: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self.grew = False  # set when a buffer was reallocated (graphs must be recaptured)

    def view(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = int(np.prod(shape))
        flat = self._flat.get((name, dtype))
        if flat is None or flat.numel() < numel:
            flat = torch.empty(numel, dtype=dtype, device=self.device)
            self._flat[(name, dtype)] = flat
            self.grew = True
        return flat[:numel].view(shape)


def packed_steps(
    weights: StepWeights,
    pre: torch.Tensor,
    batch_sizes: list[int],
    offsets: list[int],
    h: torch.Tensor,
    c: torch.Tensor,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The recurrence over a packed batch (``PackPlan`` layout), as ``model.ReferenceStep``.

    pre ``[2, N, 4D]`` without bias; h ``[2, B, P]``, c ``[2, B, D]`` fp32 initial state in
    rank order. Returns the packed output ``[2, N, P]`` fp32 (into ``out`` if given) and
    the final h, c.
    """
    d, p = c.shape[-1], h.shape[-1]
    h = h.float().clone()  # rows that end keep their final value in place
    c = c.float().clone()
    h_in = h if weights.dtype == torch.float32 else h.to(weights.dtype)
    out = float32_out((2, pre.shape[1], p), pre, out)
    buffers = Buffers(pre.device)
    for t, n in enumerate(batch_sizes):
        start = offsets[t]
        fused_step(
            weights, pre[:, start : start + n], h, h_in, c, out[:, start : start + n],
            rec=buffers.view("rec", (2, n, 4 * d), weights.dtype),
            cell=buffers.view("cell", (2, n, d), weights.dtype),
            proj=buffers.view("proj", (2, n, p), weights.dtype),
        )
    return out, h, c
