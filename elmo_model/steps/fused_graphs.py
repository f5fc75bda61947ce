"""The fused Triton LSTM step as embedders run it (``FusedStep``, ``lstm_impl="fused"``):
the packed loop of ``fused_lstm.py``, or for batches of similar sentence lengths the same
kernels on a padded ``[steps, batch]`` grid, captured as a CUDA graph per bucket.

A fixed grid lets a whole time loop be captured once and replayed without per-step launch
overhead; rows past their length keep their state (the kernels mask them by ``lengths``).
A batch of mixed lengths is cut into groups of one length bucket each, and each group
that pads well runs its own graph: on real text a packed loop launches four kernels a time
step from Python, and that host time, not the GPU, bounded the model (BENCHMARKS.md, "One
GPU: model only vs end to end"). Importing this module imports triton, as ``fused_lstm``
does.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from elmo_model.model import BiLstmLayer, CharCNN
from elmo_model.pack_plan import LayerInput, PackPlan, float32_out, packed_input
from elmo_model.steps.fused_lstm import Buffers, StepWeights, fused_step, packed_steps
from elmo_model.weight_versions import DerivedWeights

# Bucket sizes: 4 per octave (8, 10, 12, 14, 16, 20, ...), so a bucket wastes under 25% of a
# dimension and a long job sees a few dozen distinct shapes at most.
_BUCKETS = sorted({(4 + j) << shift for shift in range(1, 24) for j in range(4)})
_BUCKET_ARRAY = np.array(_BUCKETS)


def bucket_size(n: int) -> int:
    """The smallest bucket >= n (n >= 1)."""
    if n < 1:
        raise ValueError(f"bucket_size needs n >= 1, got {n}")
    for size in _BUCKETS:
        if size >= n:
            return size
    raise ValueError(f"{n} is beyond the largest bucket {_BUCKETS[-1]}")


def length_groups(sorted_lengths: np.ndarray) -> list[tuple[int, int]]:
    """Rank ranges ``[r0, r1)`` of sequences (lengths in descending order) whose lengths
    share a bucket, longest first."""
    buckets = _BUCKET_ARRAY[np.searchsorted(_BUCKET_ARRAY, sorted_lengths)]
    bounds = [0, *(np.flatnonzero(np.diff(buckets)) + 1).tolist(), len(sorted_lengths)]
    return list(itertools.pairwise(bounds))


def group_positions(batch_sizes: list[int], offsets: list[int], r0: int, r1: int,
                    steps: int) -> tuple[np.ndarray, list[int]]:
    """The packed positions of ranks ``[r0, r1)`` (whose longest has ``steps`` tokens), in
    their own packed order, and their batch sizes per step."""
    sizes = np.minimum(np.asarray(batch_sizes[:steps]), r1) - r0
    starts = np.asarray(offsets[:steps]) + r0
    within = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return np.repeat(starts, sizes) + within, sizes.tolist()


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
    def allocate(cls, buffers: Buffers, batch: int, steps: int, d: int, p: int,
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
    # A grid this small is padded whatever its share of padding: its FLOPs cost the GPU
    # less than launching its steps one by one costs the host (the long sentences of a
    # batch, a few rows for up to 256 steps).
    small_grid = 4096

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers = Buffers(device)
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.padded_runs = 0  # time loops run padded (replayed, on a GPU), for benchmarks

    def fits(self, batch_sizes: list[int]) -> bool:
        """Whether a batch is worth padding to its bucket (similar sentence lengths, as
        a group of one length bucket has, or a small grid)."""
        grid = bucket_size(batch_sizes[0]) * bucket_size(len(batch_sizes))
        return grid <= self.max_padding * sum(batch_sizes) or grid <= self.small_grid

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
        out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``[2, N, P]`` packed layer input (matmul dtype); lengths ``[B]`` rank order;
        h, c initial state ``[2, B, *]`` rank order. Returns as ``packed_steps`` (the
        output into ``out`` if given)."""
        batch, p, d = h.shape[1], h.shape[-1], c.shape[-1]
        padded_batch, steps = bucket_size(batch), bucket_size(len(batch_sizes))
        self.padded_runs += 1
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
        out = torch.index_select(run.out, 1, positions,
                                 out=float32_out((2, x.shape[1], p), x, out))
        return out, run.h[:, :batch].clone(), run.c[:, :batch].clone()

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


# Per layer and dtype: the weights cast once; kept while unchanged, since a captured graph
# reads them by address.
_STEP_WEIGHTS = DerivedWeights()


def step_weights(layer: BiLstmLayer, dtype: torch.dtype) -> tuple[torch.Tensor, StepWeights]:
    """The layer's input weight ``[2, P, 4D]`` and step weights in the matmul ``dtype``."""

    def cast() -> tuple[torch.Tensor, StepWeights]:
        w_in, w_rec, w_proj = (p.detach().to(dtype) for p in
                               (layer.input_weight, layer.recurrent_weight, layer.projection))
        return w_in, StepWeights(w_rec, w_proj, layer.bias.detach().float().contiguous(),
                                 layer.cell_clip, layer.proj_clip)

    return _STEP_WEIGHTS.get(layer, dtype, cast)


class FusedStep:
    """``LstmStep``: the fused Triton step (CUDA; the interpreter in tests).

    With ``graphs`` (what ``auto`` picks on CUDA), a batch that pads well
    (``RecurrenceGraphs.fits``) runs the captured padded loop; one of mixed lengths runs
    as groups of one length bucket each, padded where the group pads well, packed where
    not; without ``graphs``, every batch runs packed.
    """

    def __init__(self, graphs: bool = True) -> None:
        self.graphs = graphs
        self._recurrence_graphs: dict[torch.device, RecurrenceGraphs] = {}

    def recurrence_graphs(self, device: torch.device) -> RecurrenceGraphs:
        """This step's graphs and padded buffers on ``device``, shared by all layers."""
        if device.type == "cuda" and device.index is None:  # "cuda" is "cuda:0" (current)
            device = torch.device("cuda", torch.cuda.current_device())
        if device not in self._recurrence_graphs:
            self._recurrence_graphs[device] = RecurrenceGraphs(device)
        return self._recurrence_graphs[device]

    def __call__(self, layer: BiLstmLayer, x: LayerInput, plan: PackPlan, h: torch.Tensor,
                 c: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = packed_input(x)
        w_in, weights = step_weights(layer, dtype)
        graphs = self.recurrence_graphs(x.device) if self.graphs else None
        sorted_lengths = plan.lengths[plan.order]
        groups = length_groups(sorted_lengths) if graphs is not None else []
        if graphs is None or (len(groups) == 1 and not graphs.fits(plan.batch_sizes)):
            pre = torch.bmm(x.to(dtype), w_in)  # [2, N, 4D]; the kernel adds the bias
            return packed_steps(weights, pre, plan.batch_sizes, plan.offsets, h, c, out)
        # The graph reads these weight tensors by address: a recast (new dtype, new
        # weights) makes new tensors, and so a new key and a new capture.
        key = (id(layer), weights.w_rec.data_ptr(), weights.w_proj.data_ptr(),
               weights.bias.data_ptr())
        if graphs.fits(plan.batch_sizes):
            return graphs.run(key, weights, x.to(dtype), w_in, plan.batch_sizes,
                              sorted_lengths, h, c, out)
        out = float32_out((2, x.shape[1], h.shape[-1]), x, out)
        h_out = torch.empty_like(h, dtype=torch.float32)
        c_out = torch.empty_like(c, dtype=torch.float32)
        for r0, r1 in groups:  # each group's rows are independent of the others'
            positions, sizes = group_positions(plan.batch_sizes, plan.offsets, r0, r1,
                                               int(sorted_lengths[r0]))
            rows = torch.from_numpy(positions).to(x.device)
            x_group = x[:, rows].to(dtype)
            if graphs.fits(sizes):
                got = graphs.run(key, weights, x_group, w_in, sizes, sorted_lengths[r0:r1],
                                 h[:, r0:r1], c[:, r0:r1])
            else:
                offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()
                got = packed_steps(weights, torch.bmm(x_group, w_in), sizes, offsets,
                                   h[:, r0:r1], c[:, r0:r1])
            out[:, rows], h_out[:, r0:r1], c_out[:, r0:r1] = got
        return out, h_out, c_out

    def char_cnn_linears(self, char_cnn: CharCNN, dtype: torch.dtype) -> None:
        return None
