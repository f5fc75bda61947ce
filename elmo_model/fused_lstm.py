"""The biLM's LSTM step as two fused Triton kernels, and the time loops that launch them.

One step of one layer, both directions at once (see ``model.BiLstmLayer``)::

    rec  = h_in @ W_rec                                   cuBLAS  [2, n, 4D]  matmul dtype
    cell = gates_cell_kernel(rec, pre, bias, c)           Triton  [2, n, D]   matmul dtype
           (adds bias, gates, updates and clips c in place: c stays float32)
    proj = cell @ W_proj                                  cuBLAS  [2, n, P]   matmul dtype
    projection_clip_kernel(proj) -> out slice (fp32), h state (fp32), next h_in (matmul dtype)

The unfused step makes ~12 passes over the ``[2, n, 4D]`` float32 gates; here the gates
are read once, in the matmul's dtype, and the gate math runs in float32 registers.

Two time loops share those kernels:

* ``packed_steps``: the packed layout of ``PackPlan`` (only real tokens at each step).
* ``PaddedRun.steps``: a fixed ``[steps, batch]`` grid where rows past their length keep
  their state (masked by ``lengths``); fixed shapes are what a CUDA graph needs, so
  ``RecurrenceGraphs`` captures this loop once per (batch, steps) bucket and replays it.

The projection matmul stays cuBLAS (its clip is the second kernel's first operation): a
Triton matmul with the clip as epilogue would save one small pass over ``[2, n, P]``.

Importing this module imports triton; ``model.py`` imports it only when the fused path is
chosen. The same launches run on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1`` set before triton is imported), which is how the tests check them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

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


class _Buffers:
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The recurrence over a packed batch (``PackPlan`` layout), as ``model._steps``.

    pre ``[2, N, 4D]`` without bias; h ``[2, B, P]``, c ``[2, B, D]`` fp32 initial state in
    rank order. Returns the packed output ``[2, N, P]`` fp32 and the final h, c.
    """
    d, p = c.shape[-1], h.shape[-1]
    h = h.float().clone()  # rows that end keep their final value in place
    c = c.float().clone()
    h_in = h if weights.dtype == torch.float32 else h.to(weights.dtype)
    out = pre.new_empty(2, pre.shape[1], p, dtype=torch.float32)
    buffers = _Buffers(pre.device)
    for t, n in enumerate(batch_sizes):
        start = offsets[t]
        fused_step(
            weights, pre[:, start : start + n], h, h_in, c, out[:, start : start + n],
            rec=buffers.view("rec", (2, n, 4 * d), weights.dtype),
            cell=buffers.view("cell", (2, n, d), weights.dtype),
            proj=buffers.view("proj", (2, n, p), weights.dtype),
        )
    return out, h, c


# Bucket sizes: 4 per octave (8, 10, 12, 14, 16, 20, ...), so a bucket wastes under 25% of a
# dimension and a long job sees a few dozen distinct shapes at most.
_BUCKETS = sorted({(4 + j) << shift for shift in range(1, 24) for j in range(4)})


def bucket_size(n: int) -> int:
    """The smallest bucket >= n (n >= 1)."""
    if n < 1:
        raise ValueError(f"bucket_size needs n >= 1, got {n}")
    for size in _BUCKETS:
        if size >= n:
            return size
    raise ValueError(f"{n} is beyond the largest bucket {_BUCKETS[-1]}")


def padded_positions(batch_sizes: list[int], padded_batch: int) -> np.ndarray:
    """For each packed position (step t, rank r), its row ``t * padded_batch + r`` in the
    padded ``[steps, padded_batch]`` grid."""
    sizes = np.asarray(batch_sizes, dtype=np.int64)
    steps = np.repeat(np.arange(len(sizes)), sizes)
    ranks = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return steps * padded_batch + ranks


@dataclass
class PaddedRun:
    """Inputs and outputs of one padded time loop; all tensors stay put between calls."""

    pre: torch.Tensor  # [2, steps * batch, 4D] matmul dtype, no bias
    lengths: torch.Tensor  # [batch] int32, rank order; 0 for padding rows
    h: torch.Tensor  # [2, batch, P] fp32: initial state in, final state out
    h_in: torch.Tensor  # h, or its matmul-dtype copy
    c: torch.Tensor  # [2, batch, D] fp32, in and out
    out: torch.Tensor  # [2, steps * batch, P] fp32
    rec: torch.Tensor
    cell: torch.Tensor
    proj: torch.Tensor

    @classmethod
    def allocate(cls, buffers: _Buffers, batch: int, steps: int, d: int, p: int,
                 dtype: torch.dtype) -> PaddedRun:
        f32 = torch.float32
        h = buffers.view("h", (2, batch, p), f32)
        return cls(
            pre=buffers.view("pre", (2, steps * batch, 4 * d), dtype),
            lengths=buffers.view("lengths", (batch,), torch.int32),
            h=h,
            h_in=h if dtype == f32 else buffers.view("h_in", (2, batch, p), dtype),
            c=buffers.view("c", (2, batch, d), f32),
            out=buffers.view("out", (2, steps * batch, p), f32),
            rec=buffers.view("rec", (2, batch, 4 * d), dtype),
            cell=buffers.view("cell", (2, batch, d), dtype),
            proj=buffers.view("proj", (2, batch, p), dtype),
        )

    def steps(self, weights: StepWeights) -> None:
        """The whole time loop; every launch has a fixed shape (capturable)."""
        batch = self.h.shape[1]
        for t in range(self.pre.shape[1] // batch):
            rows = slice(t * batch, (t + 1) * batch)
            fused_step(weights, self.pre[:, rows], self.h, self.h_in, self.c, self.out[:, rows],
                       self.rec, self.cell, self.proj, lengths=self.lengths, step=t)


class RecurrenceGraphs:
    """The padded time loop per (layer, batch bucket, steps bucket, dtype), captured as a
    CUDA graph on first use and replayed after; on a CPU device (the interpreter in tests)
    the same loop runs uncaptured.

    All captured tensors live in one set of flat buffers shared by every layer and bucket
    (layers run one after another), so memory is that of the largest bucket, not the sum.
    When a larger bucket needs bigger buffers, every graph is dropped and recaptured.
    """

    # Padded grid cells per real token above which the packed loop is the better deal:
    # padding costs FLOPs in proportion, launch overhead only matters for small batches.
    max_padding = 1.35

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers = _Buffers(device)
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}

    def fits(self, batch_sizes: list[int]) -> bool:
        """Whether a batch is worth padding to its bucket (similar sentence lengths, as
        the stateless embedder's length-sorted batches have)."""
        grid = bucket_size(batch_sizes[0]) * bucket_size(len(batch_sizes))
        return grid <= self.max_padding * sum(batch_sizes)

    def run(
        self,
        key: object,
        weights: StepWeights,
        x: torch.Tensor,
        w_in: torch.Tensor,
        batch_sizes: list[int],
        lengths: np.ndarray,
        h: torch.Tensor,
        c: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``[2, N, P]`` packed layer input (matmul dtype); lengths ``[B]`` rank order;
        h, c initial state ``[2, B, *]`` rank order. Returns as ``packed_steps``."""
        batch, p, d = h.shape[1], h.shape[-1], c.shape[-1]
        padded_batch, steps = bucket_size(batch), bucket_size(len(batch_sizes))
        self.buffers.grew = False
        run = PaddedRun.allocate(self.buffers, padded_batch, steps, d, p, weights.dtype)
        if self.buffers.grew:
            self.graphs.clear()
        # Inputs go into the captured tensors; padding rows get length 0 and zero state.
        positions = torch.from_numpy(padded_positions(batch_sizes, padded_batch)).to(x.device)
        x_padded = x.new_zeros(2, steps * padded_batch, p)
        x_padded[:, positions] = x
        torch.bmm(x_padded, w_in, out=run.pre)
        run.lengths.zero_()
        run.lengths[:batch] = torch.from_numpy(lengths.astype(np.int32)).to(x.device)
        run.h.zero_()
        run.h[:, :batch] = h
        if run.h_in is not run.h:
            run.h_in.copy_(run.h)
        run.c.zero_()
        run.c[:, :batch] = c
        if self.device.type != "cuda":
            run.steps(weights)
        else:
            graph_key = (key, padded_batch, steps, weights.dtype)
            graph = self.graphs.get(graph_key)
            if graph is None:
                graph = self._capture(run, weights)
                self.graphs[graph_key] = graph
            graph.replay()
        return run.out[:, positions], run.h[:, :batch].clone(), run.c[:, :batch].clone()

    def _capture(self, run: PaddedRun, weights: StepWeights) -> torch.cuda.CUDAGraph:
        # One uncaptured run first compiles the kernels and picks cuBLAS algorithms; it
        # updates h and c in place, so the inputs are put back before capturing (capture
        # itself executes nothing; ``run`` replays the graph next).
        saved = [t.clone() for t in (run.h, run.h_in, run.c)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run.steps(weights)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run.steps(weights)
        for tensor, value in zip((run.h, run.h_in, run.c), saved, strict=True):
            tensor.copy_(value)
        return graph
