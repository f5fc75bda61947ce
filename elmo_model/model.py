"""The ELMo biLM (Peters et al. 2018), readable top to bottom.

    char ids [N, C] ──CharCNN──> token vectors [N, P]          (context free: layer 0)
    token vectors ──forward LSTM stack──>  h_fwd_j [N, P]  j = 1..L
    token vectors ──backward LSTM stack──> h_bwd_j [N, P]  (reads each sentence reversed)
    layer j = [h_fwd_j ; h_bwd_j]  -> [L + 1, N, 2P]

Shapes use: N real tokens in a batch (sentence boundaries included), B sentences,
T the longest sentence, C chars per token (50), P projection dim, D LSTM cells.

Sentences are processed "packed": sorted by length, time-major, with only the real
tokens of each time step in the active batch, so no FLOP is spent on padding. The
backward direction reads each sentence reversed in place, which gives it the same
packing as the forward one; both directions then run as one batched matmul per step.

Inference runs one of three versions of the same step (``LSTM_IMPLS``): the in-place torch
step; the CPU's default, which makes the same calls through oneDNN on weights reordered
once (``onednn.py``); and on CUDA the fused Triton step (``fused_lstm.py``). Training
always runs the out-of-place torch step, which autograd can follow.
"""

from __future__ import annotations

import importlib.util
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from elmo_model.char_ids import BOS_TOKEN, EOS_TOKEN, PADDING, token_char_ids

if TYPE_CHECKING:
    from elmo_model.fused_lstm import RecurrenceGraphs, StepWeights
    from elmo_model.onednn import PackedLinear

T = TypeVar("T")


@dataclass(frozen=True)
class BiLMConfig:
    """The network's shape: the numbers in a bilm-tf ``options.json``."""

    n_layers: int = 2
    lstm_dim: int = 4096  # LSTM cells D
    projection_dim: int = 512  # P; the token layer and each direction's output
    cell_clip: float | None = 3.0
    proj_clip: float | None = 3.0
    use_skip_connections: bool = True
    char_embedding_dim: int = 16
    filters: tuple[tuple[int, int], ...] = (
        (1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024),
    )
    n_highway: int = 2
    n_characters: int = 262
    max_chars: int = 50
    activation: str = "relu"
    extra: dict = field(default_factory=dict, compare=False)  # training keys we carry along

    @property
    def n_filters(self) -> int:
        return sum(n for _, n in self.filters)

    @property
    def output_dim(self) -> int:
        return 2 * self.projection_dim

    @property
    def n_output_layers(self) -> int:
        return self.n_layers + 1

    def forward_flops_per_token(self) -> int:
        """Multiply-adds x 2 for one token through char CNN, highway, projection and both
        LSTM directions (the per-token cost of inference; softmax excluded)."""
        c, e = self.max_chars, self.char_embedding_dim
        conv = sum(2 * (c - w + 1) * w * e * n for w, n in self.filters)
        highway = self.n_highway * 2 * self.n_filters * 2 * self.n_filters
        projection = 2 * self.n_filters * self.projection_dim
        p, d = self.projection_dim, self.lstm_dim
        lstm_cell = 2 * (p + p) * 4 * d + 2 * d * p
        return conv + highway + projection + 2 * self.n_layers * lstm_cell


def fast_tanh(x: torch.Tensor) -> torch.Tensor:
    """``tanh(x) = 2 sigmoid(2x) - 1``: torch's CPU tanh ran 10x slower than its sigmoid here,
    enough to cost the LSTM a sixth of its time; the error stays below 1e-7."""
    s = torch.sigmoid(x * 2)
    if s.requires_grad:  # training: autograd needs sigmoid's output unmodified
        return s * 2 - 1
    return s.mul_(2).sub_(1)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The matmul dtype autocast imposes on ``device_type``; None when autocast is off."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


# Per module and dtype: (stamp of the parameters' versions, what was derived from them).
# Beside the module, not on it: a oneDNN reordered weight cannot be pickled, and a model
# must stay picklable and copyable.
_DERIVED: weakref.WeakKeyDictionary[nn.Module, dict[torch.dtype, tuple[tuple, object]]] = (
    weakref.WeakKeyDictionary()
)


def derived_weights(module: nn.Module, dtype: torch.dtype, build: Callable[[], T]) -> T:
    """``build()``'s result (weights cast or reordered for inference) for ``module`` at
    ``dtype``, built again only when a parameter of ``module`` changed (training,
    ``load_state_dict``); kept while they are unchanged, which a CUDA graph reading them
    by address relies on. One is kept per dtype, so embedders in float32 and bfloat16 can
    share a model without rebuilding. Parameters made under ``torch.inference_mode`` have
    no version counter; for them only a new tensor is seen as a change."""
    stamp = tuple((p.data_ptr(), 0 if p.is_inference() else p._version)
                  for p in module.parameters())
    by_dtype = _DERIVED.setdefault(module, {})
    cached = by_dtype.get(dtype)
    if cached is None or cached[0] != stamp:
        cached = (stamp, build())
        by_dtype[dtype] = cached
    return cached[1]  # type: ignore[return-value]


class Highway(nn.Module):
    """bilm-tf highway: ``y = g * relu(W_t x + b_t) + (1 - g) * x``, ``g = sigmoid(W_c x + b_c)``.

    Both affine maps live in one ``Linear(d, 2d)``: rows ``[:d]`` transform, ``[d:]`` carry.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x: torch.Tensor, linear: PackedLinear | None = None) -> torch.Tensor:
        """[N, d] -> [N, d]; ``linear``: this layer's affine map packed for oneDNN."""
        affine = self.linear(x) if linear is None else linear(x.to(linear.dtype))
        transform, carry = affine.split(self.dim, dim=-1)
        gate = torch.sigmoid(carry)
        return torch.lerp(x, F.relu(transform).to(x.dtype), gate.to(x.dtype))


class CharCNN(nn.Module):
    """Token char ids -> context-free token vector (the ELMo token layer)."""

    def __init__(self, config: BiLMConfig) -> None:
        super().__init__()
        if config.activation not in ("relu", "tanh"):
            raise ValueError(f"char_cnn activation must be relu or tanh, got {config.activation!r}")
        self.config = config
        # Row 0 is the mask id and stays zero; bilm-tf's 261 rows are rows 1..261.
        self.char_embedding = nn.Embedding(config.n_characters, config.char_embedding_dim,
                                           padding_idx=0)
        self.convs = nn.ModuleList(
            nn.Conv1d(config.char_embedding_dim, n, kernel_size=w) for w, n in config.filters
        )
        self.highways = nn.ModuleList(Highway(config.n_filters) for _ in range(config.n_highway))
        self.projection = nn.Linear(config.n_filters, config.projection_dim)

    # Tokens go through in padded chunks of exactly this many: every matmul then has the
    # same shape whatever the batch, so a token's vector is bitwise the same in any batch
    # (a cached vector equals a fresh one), and conv outputs stay in cache (3x faster here).
    # A GPU takes larger chunks: at 64 tokens a 131k-token batch would be ~2,000 chunks of
    # a dozen kernel launches each, and launch overhead, not FLOPs, would set the pace.
    chunk_tokens = 64
    cuda_chunk_tokens = 4096

    def chunk_size(self, device: torch.device) -> int:
        return self.cuda_chunk_tokens if device.type == "cuda" else self.chunk_tokens

    def conv_widths(self, char_ids: torch.Tensor) -> torch.Tensor:  # [N, C] -> [N]
        """How many char positions each token's convolutions need to read.

        Past a token's end-of-word marker every position is padding, and a conv window
        that lies wholly in padding gives the same vector for every token. So the
        max-pool over all C positions equals the max-pool over the windows that touch a
        real char plus one all-padding window: the first ``real + widest filter``
        positions. Rounded up to a multiple of 8, so a batch has only a few widths; a
        token's width depends on its own chars alone, which keeps its vector the same in
        any batch. On typical English, 9 tokens in 10 need 16 of the 50 positions: the
        convolutions ran 5x faster on them here.
        """
        c = char_ids.shape[1]
        real = (char_ids != PADDING + 1) & (char_ids != 0)
        positions = torch.arange(1, c + 1, device=char_ids.device)
        ends = (real * positions).amax(-1)  # [N] one past the last real char
        widest = max(width for width, _ in self.config.filters)
        return ((ends + widest + 7) // 8 * 8).clamp(max=c)

    def forward(self, char_ids: torch.Tensor,
                onednn: torch.dtype | None = None) -> torch.Tensor:  # [N, C] -> [N, P]
        """``onednn``: run the highway and projection matmuls through oneDNN on weights
        reordered once, in this dtype (CPU inference; see ``onednn.py``)."""
        n_tokens, chunk = char_ids.shape[0], self.chunk_size(char_ids.device)
        if n_tokens == 0:
            return self.projection.weight.new_zeros(0, self.config.projection_dim)
        widths = self.conv_widths(char_ids)
        pooled = []  # per conv width: (rows, [rows, F])
        for width in widths.unique().tolist():
            rows = (widths == width).nonzero().squeeze(1)
            pooled.append((rows, _in_chunks(self._pooled, char_ids[rows, :width], chunk)))
        features = pooled[0][1].new_empty(n_tokens, self.config.n_filters)  # [N, F]
        for rows, values in pooled:
            features[rows] = values
        linears = None if onednn is None else self._packed_linears(chunk, onednn)
        return _in_chunks(lambda part: self._dense(part, linears), features, chunk)

    def _packed_linears(self, rows: int, dtype: torch.dtype) -> list[PackedLinear]:
        """The highways' and the projection's weights packed for oneDNN in ``dtype``."""
        from elmo_model.onednn import PackedLinear

        linears = [*(h.linear for h in self.highways), self.projection]
        return derived_weights(self, dtype, lambda: [
            PackedLinear(linear.weight.t(), linear.bias, dtype, rows) for linear in linears])

    def _pooled(self, char_ids: torch.Tensor) -> torch.Tensor:  # [chunk, W] -> [chunk, F]
        act = torch.relu if self.config.activation == "relu" else fast_tanh
        # fp32 even under autocast: the max-pool over bf16 conv outputs ran 7x slower here.
        with torch.autocast(char_ids.device.type, enabled=False):
            chars = self.char_embedding(char_ids).transpose(1, 2)  # [chunk, E, W]
            # max over char positions, then the activation (bilm-tf's order)
            return torch.cat([act(conv(chars).amax(-1)) for conv in self.convs], -1)

    def _dense(self, x: torch.Tensor,
               linears: list[PackedLinear] | None) -> torch.Tensor:  # [chunk, F] -> [chunk, P]
        if linears is None:
            for highway in self.highways:
                x = highway(x)
            return self.projection(x)
        for highway, linear in zip(self.highways, linears, strict=False):
            x = highway(x, linear)
        return linears[-1](x.to(linears[-1].dtype))


def _in_chunks(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
               chunk: int) -> torch.Tensor:
    """``fn`` over ``x`` ``[N, ...]`` in zero-padded chunks of exactly ``chunk`` rows."""
    n = x.shape[0]
    padded = F.pad(x, (0, 0, 0, -n % chunk))
    return torch.cat([fn(part) for part in padded.split(chunk)])[:n]


@dataclass
class PackPlan:
    """Where each real token sits in the packed, length-sorted, time-major layout.

    Tokens are numbered in *canonical* order: sentence after sentence, boundaries
    included. Packed position ``offsets[t] + r`` holds time step ``t`` of the sentence of
    rank ``r`` (by descending length); ``forward_index`` / ``backward_index`` give its
    canonical number read forwards / backwards.
    """

    lengths: np.ndarray  # [B] tokens per sentence, canonical order
    order: np.ndarray  # [B] sentence index of each rank
    batch_sizes: list[int]  # [T] active sentences at each step (non-increasing)
    offsets: list[int]  # [T] packed start of each step
    forward_index: torch.Tensor  # [N] packed -> canonical, forward reading
    backward_index: torch.Tensor  # [N] packed -> canonical, reversed reading

    @classmethod
    def build(cls, lengths: np.ndarray, device: torch.device | str = "cpu") -> PackPlan:
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.size == 0 or lengths.min() < 1:
            raise ValueError("every sequence needs at least one token")
        order = np.argsort(-lengths, kind="stable")
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        sorted_lengths = lengths[order]
        batch_sizes = [int((sorted_lengths > t).sum()) for t in range(int(sorted_lengths[0]))]
        offsets = np.concatenate([[0], np.cumsum(batch_sizes)[:-1]]).astype(int).tolist()
        fwd, bwd = [], []
        for t, n in enumerate(batch_sizes):
            rows = order[:n]
            fwd.append(starts[rows] + t)
            bwd.append(starts[rows] + lengths[rows] - 1 - t)
        to_tensor = lambda parts: torch.from_numpy(np.concatenate(parts)).to(device)  # noqa: E731
        return cls(lengths, order, batch_sizes, offsets, to_tensor(fwd), to_tensor(bwd))

    @property
    def n_tokens(self) -> int:
        return int(self.lengths.sum())


# Per layer: (h [2, B, P], c [2, B, D]), direction 0 forward, 1 backward, canonical row order.
LstmState = list[tuple[torch.Tensor, torch.Tensor]]


class BiLstmLayer(nn.Module):
    """One LSTM layer for both directions at once, bilm-tf's LSTMCell semantics:

        gates = W [x; h_prev] + b           gate order here: input, forget, output, candidate
        c = sigmoid(f) * c_prev + sigmoid(i) * tanh(g)      then clip to +-cell_clip
        h = clip(W_p (sigmoid(o) * tanh(c)), +-proj_clip)   projected to P

    TensorFlow adds 1.0 to the forget gate at run time; we fold it into the bias at load.
    """

    def __init__(self, config: BiLMConfig) -> None:
        super().__init__()
        p, d = config.projection_dim, config.lstm_dim
        self.cell_clip = config.cell_clip
        self.proj_clip = config.proj_clip
        scale = 1.0 / math.sqrt(d)
        self.input_weight = nn.Parameter(torch.empty(2, p, 4 * d).uniform_(-scale, scale))
        self.recurrent_weight = nn.Parameter(torch.empty(2, p, 4 * d).uniform_(-scale, scale))
        self.bias = nn.Parameter(torch.zeros(2, 4 * d))
        self.projection = nn.Parameter(torch.empty(2, d, p).uniform_(-scale, scale))
        with torch.no_grad():
            self.bias[:, d : 2 * d] = 1.0  # forget gate

    def forward(
        self,
        x: torch.Tensor,
        plan: PackPlan,
        h: torch.Tensor,
        c: torch.Tensor,
        impl: str = "reference",
        graphs: RecurrenceGraphs | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: packed input ``[2, N, P]``; h, c: initial state ``[2, B, *]`` in rank order.
        Returns packed output ``[2, N, P]`` and the final state ``[2, B, *]`` (rank order).

        impl: the inference step (see ``LSTM_IMPLS``); with autograd on, always the
        out-of-place reference. ``graphs`` holds the CUDA graphs of ``triton-graphs``.
        """
        device_type = x.device.type
        # Under autocast the matmuls run in bf16/fp16 with the weights cast once per call
        # (autocast itself recasts them at every step), while gates, cell state and
        # outputs stay float32, so the recurrence does not round its state every step.
        low = autocast_dtype(device_type)
        with torch.autocast(device_type, enabled=False):
            if impl in ("triton", "triton-graphs") and not torch.is_grad_enabled():
                return self._fused(x, plan, h, c, low or torch.float32, graphs)
            if impl == "onednn" and not torch.is_grad_enabled() and onednn_runs(low):
                return self._steps_onednn(x, plan, h.float(), c.float(), low or torch.float32)
            weights = (self.input_weight, self.recurrent_weight, self.projection)
            w_in, w_rec, w_proj = weights if low is None else (w.to(low) for w in weights)
            # All input projections in one matmul; only the recurrent product runs per step.
            if low is None:
                pre = torch.baddbmm(self.bias.unsqueeze(1), x, w_in)  # [2, N, 4D]
            else:
                # Kept low precision and without the bias: rounding x W alone is 2-3x more
                # accurate than rounding x W + b (the forget bias is 1.0), and each step
                # widens its slice to fp32 while it is in cache.
                pre = torch.bmm(x.to(low), w_in)
            run = self._steps if torch.is_grad_enabled() else self._steps_in_place
            return run(pre, plan, h.float(), c.float(), w_rec, w_proj)

    def _fused(self, x: torch.Tensor, plan: PackPlan, h: torch.Tensor, c: torch.Tensor,
               dtype: torch.dtype, graphs: RecurrenceGraphs | None):
        """The recurrence with the fused Triton step (CUDA; the interpreter in tests)."""
        from elmo_model import fused_lstm

        w_in, weights = self._step_weights(dtype)
        if graphs is None or not graphs.fits(plan.batch_sizes):
            pre = torch.bmm(x.to(dtype), w_in)  # [2, N, 4D]; the kernel adds the bias
            return fused_lstm.packed_steps(weights, pre, plan.batch_sizes, plan.offsets, h, c)
        # The graph reads these weight tensors by address: a recast (new dtype, new
        # weights) makes new tensors, and so a new key and a new capture.
        key = (id(self), weights.w_rec.data_ptr(), weights.w_proj.data_ptr(),
               weights.bias.data_ptr())
        return graphs.run(key, weights, x.to(dtype), w_in, plan.batch_sizes,
                          plan.lengths[plan.order], h.float(), c.float())

    def _step_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, StepWeights]:
        """Weights in the matmul dtype, cast once and kept while the parameters are
        unchanged (a CUDA graph reads them by address, so they must stay put)."""
        from elmo_model.fused_lstm import StepWeights

        def cast() -> tuple[torch.Tensor, StepWeights]:
            w_in, w_rec, w_proj = (p.detach().to(dtype) for p in
                                   (self.input_weight, self.recurrent_weight, self.projection))
            return w_in, StepWeights(w_rec, w_proj, self.bias.detach().float().contiguous(),
                                     self.cell_clip, self.proj_clip)

        return derived_weights(self, dtype, cast)

    def _steps(self, pre: torch.Tensor, plan: PackPlan, h: torch.Tensor, c: torch.Tensor,
               w_rec: torch.Tensor, w_proj: torch.Tensor):
        """The recurrence, out of place (for autograd)."""
        d = c.shape[-1]
        low = w_rec.dtype if w_rec.dtype != torch.float32 else None
        out = pre.new_empty(2, pre.shape[1], w_proj.shape[-1], dtype=torch.float32)
        final_h, final_c = h.clone(), c.clone()
        for t, n in enumerate(plan.batch_sizes):
            if n < h.shape[1]:  # sentences of rank >= n just ended: keep their state
                final_h[:, n : h.shape[1]] = h[:, n:]
                final_c[:, n : h.shape[1]] = c[:, n:]
                h, c = h[:, :n], c[:, :n]
            start = plan.offsets[t]
            gates = torch.bmm(h.to(w_rec.dtype), w_rec).float() + pre[:, start : start + n]
            if low is not None:
                gates = gates + self.bias.unsqueeze(1)
            ifo = torch.sigmoid(gates[..., : 3 * d])
            candidate = fast_tanh(gates[..., 3 * d :])
            c = torch.addcmul(ifo[..., d : 2 * d] * c, ifo[..., :d], candidate)
            if self.cell_clip:
                c = c.clamp(-self.cell_clip, self.cell_clip)
            cell_out = ifo[..., 2 * d :] * fast_tanh(c)
            h = torch.bmm(cell_out.to(w_proj.dtype), w_proj).float()
            if self.proj_clip:
                h = h.clamp(-self.proj_clip, self.proj_clip)
            out[:, start : start + n] = h
        final_h[:, : h.shape[1]] = h
        final_c[:, : c.shape[1]] = c
        return out, final_h, final_c

    def _steps_in_place(self, pre: torch.Tensor, plan: PackPlan, h: torch.Tensor,
                        c: torch.Tensor, w_rec: torch.Tensor, w_proj: torch.Tensor):
        """The same recurrence for inference, in preallocated buffers: fresh multi-MB
        tensors at every step cost page faults that took up to a third of the time here."""
        batch, d, p = c.shape[1], c.shape[-1], w_proj.shape[-1]
        low = w_rec.dtype if w_rec.dtype != torch.float32 else None
        f32 = torch.float32
        out = pre.new_empty(2, pre.shape[1], p, dtype=f32)
        c = c.clone()  # updated in place; rows that end keep their final value
        final_h = h.clone()
        flat_gates = pre.new_empty(2 * batch * 4 * d, dtype=f32)
        flat_cell = pre.new_empty(2 * batch * d, dtype=f32)
        flat_h = pre.new_empty(2 * batch * p, dtype=f32)
        if low is not None:
            bias = self.bias.unsqueeze(1)
            flat_rec = pre.new_empty(2 * batch * 4 * d, dtype=low)
            flat_pre = pre.new_empty(2 * batch * 4 * d, dtype=f32)
            flat_cell_low = pre.new_empty(2 * batch * d, dtype=low)
            flat_h_low = pre.new_empty(2 * batch * p, dtype=low)
        for t, n in enumerate(plan.batch_sizes):
            if n < h.shape[1]:
                final_h[:, n : h.shape[1]] = h[:, n:]
                h = h[:, :n]
            start = plan.offsets[t]
            gates = flat_gates[: 2 * n * 4 * d].view(2, n, 4 * d)
            if low is None:
                torch.baddbmm(pre[:, start : start + n], h, w_rec, out=gates)
            else:
                rec = flat_rec[: 2 * n * 4 * d].view(2, n, 4 * d)
                torch.bmm(h.to(low), w_rec, out=rec)
                widened = flat_pre[: 2 * n * 4 * d].view(2, n, 4 * d)
                widened.copy_(pre[:, start : start + n])
                gates.copy_(rec).add_(widened).add_(bias)
            cell = cell_update_(gates, c[:, :n], flat_cell[: 2 * n * d].view(2, n, d),
                                self.cell_clip)
            h = flat_h[: 2 * n * p].view(2, n, p)
            if low is None:
                torch.bmm(cell, w_proj, out=h)
            else:
                cell_low = flat_cell_low[: 2 * n * d].view(2, n, d).copy_(cell)
                h_low = flat_h_low[: 2 * n * p].view(2, n, p)
                h.copy_(torch.bmm(cell_low, w_proj, out=h_low))
            if self.proj_clip:
                h.clamp_(-self.proj_clip, self.proj_clip)
            out[:, start : start + n] = h
        final_h[:, : h.shape[1]] = h
        return out, final_h, c

    def _steps_onednn(self, x: torch.Tensor, plan: PackPlan, h: torch.Tensor,
                      c: torch.Tensor, dtype: torch.dtype):
        """The in-place recurrence with oneDNN matmuls on weights reordered once (the CPU's
        inference step, ``onednn.py``), one direction after the other: the matmuls are
        per direction anyway, and only one direction's input projections are held."""
        from elmo_model.onednn import PackedLinear

        low = dtype != torch.float32
        batch, d, p = c.shape[1], c.shape[-1], self.projection.shape[-1]
        directions = derived_weights(self, dtype, lambda: [
            (PackedLinear(self.input_weight[k], None if low else self.bias[k], dtype, 1024),
             PackedLinear(self.recurrent_weight[k], None, dtype),
             PackedLinear(self.projection[k], None, dtype))
            for k in range(2)])
        out = x.new_empty(2, x.shape[1], p, dtype=torch.float32)
        c = c.clone()  # updated in place; rows that end keep their final value
        final_h = h.clone()
        flat_cell = x.new_empty(batch * d, dtype=torch.float32)
        flat_gates = x.new_empty(batch * 4 * d, dtype=torch.float32) if low else None
        for k, (w_in, w_rec, w_proj) in enumerate(directions):
            # In low precision without the bias, as in _steps_in_place (rounding x W alone is
            # more accurate); the bias is added in float32 at each step.
            pre = w_in(x[k].to(dtype))  # [N, 4D]
            h_k = h[k]
            for t, n in enumerate(plan.batch_sizes):
                if n < h_k.shape[0]:  # sentences of rank >= n just ended: keep their state
                    final_h[k, n : h_k.shape[0]] = h_k[n:]
                    h_k = h_k[:n]
                start = plan.offsets[t]
                if flat_gates is None:
                    gates = w_rec(h_k, add=pre[start : start + n])  # [n, 4D]
                else:
                    gates = flat_gates[: n * 4 * d].view(n, 4 * d)
                    gates.copy_(w_rec(h_k.to(dtype))).add_(pre[start : start + n])
                    gates.add_(self.bias[k])
                cell = cell_update_(gates, c[k, :n], flat_cell[: n * d].view(n, d),
                                    self.cell_clip)
                h_k = w_proj(cell.to(dtype)).float()  # [n, P]
                if self.proj_clip:
                    h_k.clamp_(-self.proj_clip, self.proj_clip)
                out[k, start : start + n] = h_k
            final_h[k, : h_k.shape[0]] = h_k
        return out, final_h, c


def onednn_runs(low: torch.dtype | None) -> bool:
    """Whether the oneDNN step can run its matmuls in ``low`` (None: float32) here; where
    it cannot (float16, or bfloat16 on a CPU oneDNN refuses it on), the torch step runs."""
    if low not in (None, torch.bfloat16):
        return False
    from elmo_model.onednn import onednn_unavailable

    return onednn_unavailable(low or torch.float32) is None


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


@dataclass
class BiLMOutput:
    layers: torch.Tensor  # [L + 1, B, T, 2P]
    mask: torch.Tensor  # [B, T] bool, True where a token is


# The LSTM inference step. ``reference``: the in-place torch step; ``onednn``: the same
# step with oneDNN matmuls on weights reordered once, and the char CNN's highway and
# projection matmuls too (CPU only, ``onednn.py``); ``triton``: the fused Triton step over
# the packed batch; ``triton-graphs``: the fused step on bucketed padded shapes, captured
# as CUDA graphs (no per-step launch overhead), for batches of similar sentence lengths
# (``RecurrenceGraphs.fits``; others run packed). ``auto``: triton-graphs on CUDA when
# triton imports, onednn on the CPU when oneDNN's ops run, else reference.
LSTM_IMPLS = ("auto", "reference", "onednn", "triton", "triton-graphs")


def fused_lstm_unavailable(device: torch.device | str) -> str | None:
    """Why ``auto`` does not pick the fused Triton step on ``device``; None when it does."""
    if torch.device(device).type != "cuda":
        return "the fused Triton LSTM step is for CUDA devices"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'elmo-store[gpu]' for the fused step)"
    try:
        importlib.import_module("elmo_model.fused_lstm")
    except Exception as error:  # a broken triton install must not stop the model
        return f"triton failed to import ({type(error).__name__}: {error})"
    return None


class BiLM(nn.Module):
    """Char CNN + forward and backward L-layer LSTM stacks; returns all 2L + 1 layers.

    ``lstm_impl`` picks the inference step (one of ``LSTM_IMPLS``, default ``auto``).
    """

    def __init__(self, config: BiLMConfig) -> None:
        super().__init__()
        self.config = config
        self.char_cnn = CharCNN(config)
        self.layers = nn.ModuleList(BiLstmLayer(config) for _ in range(config.n_layers))
        self.lstm_impl = "auto"
        self._graphs: dict[torch.device, RecurrenceGraphs] = {}

    def resolve_lstm_impl(self, device: torch.device | str) -> tuple[str, str]:
        """The step ``lstm_impl`` means on ``device``, and a one-line reason."""
        if self.lstm_impl not in LSTM_IMPLS:
            raise ValueError(f"lstm_impl must be one of {', '.join(LSTM_IMPLS)}, "
                             f"got {self.lstm_impl!r}")
        device = torch.device(device)
        if self.lstm_impl in ("auto", "onednn"):
            from elmo_model.onednn import onednn_unavailable

            missing = onednn_unavailable() if device.type == "cpu" else "it is for the CPU"
            if missing is None:
                return "onednn", ("set explicitly" if self.lstm_impl == "onednn"
                                  else "CPU: oneDNN matmuls on weights reordered once")
            if self.lstm_impl == "onednn":
                raise ValueError(f"lstm_impl onednn cannot run on {device}: {missing}; "
                                 "use auto or reference")
            if device.type == "cpu":
                return "reference", missing
        if self.lstm_impl != "auto":
            return self.lstm_impl, "set explicitly"
        missing = fused_lstm_unavailable(device)
        if missing is not None:
            return "reference", missing
        return "triton-graphs", "CUDA device and triton importable"

    def _recurrence_graphs(self, device: torch.device) -> RecurrenceGraphs:
        from elmo_model.fused_lstm import RecurrenceGraphs

        if device not in self._graphs:
            self._graphs[device] = RecurrenceGraphs(device)
        return self._graphs[device]

    def token_embedding(self, char_ids: torch.Tensor) -> torch.Tensor:  # [N, C] -> [N, P]
        low = autocast_dtype(char_ids.device.type)
        onednn = (not torch.is_grad_enabled() and onednn_runs(low)
                  and self.resolve_lstm_impl(char_ids.device)[0] == "onednn")
        return self.char_cnn(char_ids, (low or torch.float32) if onednn else None)

    def zero_state(self, batch_size: int, device: torch.device | str = "cpu") -> LstmState:
        p, d = self.config.projection_dim, self.config.lstm_dim
        zeros = lambda dim: torch.zeros(2, batch_size, dim, device=device)  # noqa: E731
        return [(zeros(p), zeros(d)) for _ in range(self.config.n_layers)]

    def contextualize(
        self,
        tokens: torch.Tensor,
        plan: PackPlan,
        initial_state: LstmState | None = None,
        dropout: float = 0.0,
        backward_tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, LstmState]:
        """Run both LSTM stacks over token vectors in canonical order.

        tokens: ``[N, P]``, each sentence's tokens in a row, boundaries included.
        initial_state: per layer ``(h [2, B, P], c [2, B, D])`` in sentence order; zeros if None.
        Returns the LSTM layers ``[L, N, 2P]`` (canonical order; ``[..., :P]`` forward) and
        the state after each sentence's last token, per direction, in sentence order.
        backward_tokens: ``[N, P]`` for training only: the backward stack reads these instead
        of ``tokens`` (bilm-tf trains each direction on its own text stream, so truncated
        back-propagation can carry both states across consecutive windows).
        """
        n_sentences = len(plan.lengths)
        if initial_state is None:
            initial_state = self.zero_state(n_sentences, tokens.device)
        order = torch.from_numpy(plan.order).to(tokens.device)
        p = self.config.projection_dim
        backward_source = tokens if backward_tokens is None else backward_tokens
        x = torch.stack([tokens[plan.forward_index], backward_source[plan.backward_index]])
        impl = "reference" if torch.is_grad_enabled() else self.resolve_lstm_impl(x.device)[0]
        graphs = self._recurrence_graphs(x.device) if impl == "triton-graphs" else None
        outputs, final_state = [], []
        for index, (layer, (h0, c0)) in enumerate(zip(self.layers, initial_state, strict=True)):
            layer_in = F.dropout(x, dropout, self.training) if dropout else x
            y, h, c = layer(layer_in, plan, h0[:, order], c0[:, order], impl, graphs)
            if self.config.use_skip_connections and index > 0:
                y = y + x  # residual between LSTM layers, not into the first one
            outputs.append(y)
            unsort_h, unsort_c = torch.empty_like(h), torch.empty_like(c)
            unsort_h[:, order], unsort_c[:, order] = h, c
            final_state.append((unsort_h, unsort_c))
            x = y
        packed = torch.stack(outputs)  # [L, 2, N, P]
        layers = packed.new_empty(len(outputs), plan.n_tokens, 2 * p)
        layers[:, plan.forward_index, :p] = packed[:, 0]
        layers[:, plan.backward_index, p:] = packed[:, 1]
        return layers, final_state

    def forward(self, char_ids: torch.Tensor, initial_state: LstmState | None = None) -> BiLMOutput:
        """Tensor API. char_ids ``[B, T, C]`` without sentence boundaries (0 = no token).

        Adds ``<S>``/``</S>`` around each sentence, runs the biLM and strips them again.
        Returns layers ``[L + 1, B, T, 2P]`` (zeros where masked) and the mask ``[B, T]``.
        """
        batch, width, _ = char_ids.shape
        mask = char_ids[..., 0] > 0  # [B, T]
        lengths = mask.sum(dim=1)
        device = char_ids.device
        bos = torch.from_numpy(token_char_ids(BOS_TOKEN, self.config.max_chars)).to(device)
        eos = torch.from_numpy(token_char_ids(EOS_TOKEN, self.config.max_chars)).to(device)
        pieces = []
        for row in range(batch):
            n = int(lengths[row])
            pieces += [bos[None], char_ids[row, :n], eos[None]]
        flat_ids = torch.cat(pieces)  # [N, C]
        plan = PackPlan.build(lengths.cpu().numpy() + 2, device)
        tokens = self.token_embedding(flat_ids)
        lstm_layers, _ = self.contextualize(tokens, plan, initial_state)
        all_layers = torch.cat([tokens.repeat(1, 2).unsqueeze(0), lstm_layers])  # [L+1, N, 2P]
        out = all_layers.new_zeros(all_layers.shape[0], batch, width, all_layers.shape[-1])
        start = 0
        for row in range(batch):
            n = int(lengths[row])
            out[:, row, :n] = all_layers[:, start + 1 : start + 1 + n]
            start += n + 2
        return BiLMOutput(out, mask)
