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

The recurrence is written once here (``reference_step``: out of place, what autograd and
training run), and so is the forward pass (``BiLM.contextualize``: training's and the
reference). Faster versions for inference take the same arguments (``LstmStep``) and
live beside it, named and chosen once per embedder in ``lstm_steps.py``; the embedder
runs the stacks through ``packed_runner.py`` (reused buffers, distinct tokens, the last
residual left to a quantizer). The packed layout: ``pack_plan.py``; weights the fast
steps derive: ``weight_versions.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from elmo_model.char_ids import BOS_TOKEN, EOS_TOKEN, PADDING, token_char_ids
from elmo_model.pack_plan import DistinctInput, LayerInput, PackPlan, float32_out, packed_input
from elmo_model.weight_versions import VersionedWeights

Affine = Callable[[torch.Tensor], torch.Tensor]  # x [n, in] -> x W + b [n, out]


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

    def has_residual(self, layer: int) -> bool:  # LSTM layer 0..L-1: its input added?
        return self.use_skip_connections and layer > 0

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
    """``tanh(x) = 2 sigmoid(2x) - 1``: torch's CPU tanh was much slower than its sigmoid
    (BENCHMARKS.md, "Figures once in code"); the error stays below 1e-7."""
    s = torch.sigmoid(x * 2)
    if s.requires_grad:  # training: autograd needs sigmoid's output unmodified
        return s * 2 - 1
    return s.mul_(2).sub_(1)


def matmul_dtype(device_type: str) -> torch.dtype:
    """The dtype matmuls run in on ``device_type``: autocast's when it is on, else float32."""
    if not torch.is_autocast_enabled(device_type):
        return torch.float32
    return torch.get_autocast_dtype(device_type)


class Highway(nn.Module):
    """bilm-tf highway: ``y = g * relu(W_t x + b_t) + (1 - g) * x``, ``g = sigmoid(W_c x + b_c)``.

    Both affine maps live in one ``Linear(d, 2d)``: rows ``[:d]`` transform, ``[d:]`` carry.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x: torch.Tensor, linear: Affine | None = None) -> torch.Tensor:
        """[N, d] -> [N, d]; ``linear``: this layer's affine map as a fast step runs it."""
        affine = (linear or self.linear)(x)
        transform, carry = affine.split(self.dim, dim=-1)
        gate = torch.sigmoid(carry)
        return torch.lerp(x, F.relu(transform).to(x.dtype), gate.to(x.dtype))


class CharCNN(VersionedWeights):
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
    # (a cached vector equals a fresh one), and conv outputs stay in cache (faster:
    # BENCHMARKS.md, "Figures once in code").
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
        any batch. On typical English, 9 tokens in 10 need 16 of the 50 positions, so the
        convolutions do a third of the work (BENCHMARKS.md, "Figures once in code").
        """
        c = char_ids.shape[1]
        real = (char_ids != PADDING + 1) & (char_ids != 0)
        positions = torch.arange(1, c + 1, device=char_ids.device)
        ends = (real * positions).amax(-1)  # [N] one past the last real char
        widest = max(width for width, _ in self.config.filters)
        return ((ends + widest + 7) // 8 * 8).clamp(max=c)

    def forward(self, char_ids: torch.Tensor,
                linears: Sequence[Affine] | None = None) -> torch.Tensor:  # [N, C] -> [N, P]
        """``linears``: the highways' and the projection's affine maps as a fast step runs
        them (``LstmStep.char_cnn_linears``); None: this module's own."""
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
        return _in_chunks(lambda part: self._dense(part, linears), features, chunk)

    def _pooled(self, char_ids: torch.Tensor) -> torch.Tensor:  # [chunk, W] -> [chunk, F]
        act = torch.relu if self.config.activation == "relu" else fast_tanh
        # fp32 even under autocast: the max-pool over bf16 conv outputs is far slower on
        # CPUs (BENCHMARKS.md, "Figures once in code").
        with torch.autocast(char_ids.device.type, enabled=False):
            chars = self.char_embedding(char_ids).transpose(1, 2)  # [chunk, E, W]
            # max over char positions, then the activation (bilm-tf's order)
            return torch.cat([act(conv(chars).amax(-1)) for conv in self.convs], -1)

    def _dense(self, x: torch.Tensor,
               linears: Sequence[Affine] | None) -> torch.Tensor:  # [chunk, F] -> [chunk, P]
        own = [*(highway.linear for highway in self.highways), self.projection]
        *highway_maps, projection = linears or own
        for highway, linear in zip(self.highways, highway_maps, strict=True):
            x = highway(x, linear)
        return projection(x)


def _in_chunks(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
               chunk: int) -> torch.Tensor:
    """``fn`` over ``x`` ``[N, ...]`` in zero-padded chunks of exactly ``chunk`` rows."""
    n = x.shape[0]
    padded = F.pad(x, (0, 0, 0, -n % chunk))
    return torch.cat([fn(part) for part in padded.split(chunk)])[:n]


# ---------------------------------------------------------------- LSTM layers
# Per layer: (h [2, B, P], c [2, B, D]), direction 0 forward, 1 backward, canonical row order.
LstmState = list[tuple[torch.Tensor, torch.Tensor]]


class BiLstmLayer(VersionedWeights):
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

    def forward(self, x: LayerInput, plan: PackPlan, h: torch.Tensor, c: torch.Tensor,
                step: LstmStep | None = None, out: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: packed input ``[2, N, P]``; h, c: initial state ``[2, B, *]`` in rank order.
        Returns packed output ``[2, N, P]`` (into ``out`` if given) and the final state ``[2,
        B, *]`` (rank order), float32, run by ``step`` (default, autograd: the reference)."""
        device_type = x.device.type
        # Under autocast the matmuls run in bf16/fp16 with the weights cast once per call
        # (autocast itself recasts them at every step), while gates, cell state and
        # outputs stay float32, so the recurrence does not round its state every step.
        dtype = matmul_dtype(device_type)
        with torch.autocast(device_type, enabled=False):
            return step_or_reference(step)(self, x, plan, h.float(), c.float(), dtype, out)

    def matmul_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """(input ``[2, P, 4D]``, recurrent ``[2, P, 4D]``, projection ``[2, D, P]``) in
        ``dtype``."""
        weights = (self.input_weight, self.recurrent_weight, self.projection)
        return weights if dtype == torch.float32 else tuple(w.to(dtype) for w in weights)

    def input_projection(self, x: torch.Tensor, w_in: torch.Tensor) -> torch.Tensor:
        """All time steps' input products in one matmul: ``[2, N, P] -> [2, N, 4D]``; the
        recurrent product is all that runs per step."""
        if w_in.dtype == torch.float32:
            return torch.baddbmm(self.bias.unsqueeze(1), x, w_in)
        # Kept low precision and without the bias: rounding x W alone is 2-3x more accurate
        # than rounding x W + b (the forget bias is 1.0); each step widens its slice to
        # float32 and adds the bias there.
        return torch.bmm(x.to(w_in.dtype), w_in)


class LstmStep(Protocol):
    """One way to run a layer's recurrence over a packed batch, with autocast off.

    x ``[2, N, P]`` packed layer input (a ``DistinctInput`` for the first layer in
    inference); h ``[2, B, P]``, c ``[2, B, D]`` float32 initial state in rank order;
    dtype: the matmuls' (float32, or autocast's: gates, cell state and outputs stay
    float32). Returns the packed output ``[2, N, P]`` float32 (into ``out`` if given, not
    ``x``) and each sentence's state after its last token, ``[2, B, *]`` in rank order."""

    def __call__(self, layer: BiLstmLayer, x: LayerInput, plan: PackPlan, h: torch.Tensor,
                 c: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def char_cnn_linears(self, char_cnn: CharCNN,
                         dtype: torch.dtype) -> Sequence[Affine] | None:
        """The char CNN's highway and projection maps as this step runs them; None: the
        module's own."""


class ReferenceStep:
    """The recurrence written out, out of place: what autograd follows (training), and
    what every faster step is tested against."""

    def __call__(self, layer: BiLstmLayer, x: LayerInput, plan: PackPlan, h: torch.Tensor,
                 c: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, d = packed_input(x), c.shape[-1]
        w_in, w_rec, w_proj = layer.matmul_weights(dtype)
        pre = layer.input_projection(x, w_in)  # [2, N, 4D]
        out = float32_out((2, x.shape[1], w_proj.shape[-1]), x, out)
        final_h, final_c = h.clone(), c.clone()
        for t, n in enumerate(plan.batch_sizes):
            if n < h.shape[1]:  # sentences of rank >= n just ended: keep their state
                final_h[:, n : h.shape[1]] = h[:, n:]
                final_c[:, n : h.shape[1]] = c[:, n:]
                h, c = h[:, :n], c[:, :n]
            start = plan.offsets[t]
            gates = torch.bmm(h.to(dtype), w_rec).float() + pre[:, start : start + n]
            if dtype != torch.float32:
                gates = gates + layer.bias.unsqueeze(1)  # [2, n, 4D]
            ifo = torch.sigmoid(gates[..., : 3 * d])
            candidate = fast_tanh(gates[..., 3 * d :])
            c = torch.addcmul(ifo[..., d : 2 * d] * c, ifo[..., :d], candidate)  # [2, n, D]
            if layer.cell_clip:
                c = c.clamp(-layer.cell_clip, layer.cell_clip)
            cell_out = ifo[..., 2 * d :] * fast_tanh(c)
            h = torch.bmm(cell_out.to(dtype), w_proj).float()  # [2, n, P]
            if layer.proj_clip:
                h = h.clamp(-layer.proj_clip, layer.proj_clip)
            out[:, start : start + n] = h
        final_h[:, : h.shape[1]] = h
        final_c[:, : c.shape[1]] = c
        return out, final_h, final_c

    def char_cnn_linears(self, char_cnn: CharCNN, dtype: torch.dtype) -> None:
        return None


reference_step = ReferenceStep()


def step_or_reference(step: LstmStep | None) -> LstmStep:
    """``step``, or the reference step where there is none or autograd is recording (the
    faster steps have no backward)."""
    return reference_step if step is None or torch.is_grad_enabled() else step


def rank_orders(plan: PackPlan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sentence order -> rank order, rank order -> sentence order) of ``plan``'s
    sentences: the state goes in and comes out in sentence order."""
    order = torch.from_numpy(plan.order).to(device)
    return order, torch.argsort(order)


def canonical_rows(into: torch.Tensor, packed: torch.Tensor, plan: PackPlan) -> None:
    """A packed layer ``[2, N, P]`` written into ``into`` ``[N, 2P]`` in canonical order:
    forward in ``[:, :P]``, backward in ``[:, P:]``."""
    p = packed.shape[-1]
    into[:, :p].index_copy_(0, plan.forward_index, packed[0])
    into[:, p:].index_copy_(0, plan.backward_index, packed[1])


@dataclass
class BiLMOutput:
    layers: torch.Tensor  # [L + 1, B, T, 2P]
    mask: torch.Tensor  # [B, T] bool, True where a token is


class BiLM(VersionedWeights):
    """Char CNN + forward and backward L-layer LSTM stacks; returns all 2L + 1 layers.

    ``step`` (an ``LstmStep``, default ``reference_step``) runs the recurrence; embedders
    choose theirs once (``lstm_steps.choose_step``) and pass it in.
    """

    def __init__(self, config: BiLMConfig) -> None:
        super().__init__()
        self.config = config
        self.char_cnn = CharCNN(config)
        self.layers = nn.ModuleList(BiLstmLayer(config) for _ in range(config.n_layers))

    def token_embedding(self, char_ids: torch.Tensor,
                        step: LstmStep | None = None) -> torch.Tensor:  # [N, C] -> [N, P]
        dtype = matmul_dtype(char_ids.device.type)
        return self.char_cnn(char_ids, step_or_reference(step).char_cnn_linears(self.char_cnn,
                                                                                dtype))

    def zero_state(self, batch_size: int, device: torch.device | str = "cpu") -> LstmState:
        p, d = self.config.projection_dim, self.config.lstm_dim
        zeros = lambda dim: torch.zeros(2, batch_size, dim, device=device)  # noqa: E731
        return [(zeros(p), zeros(d)) for _ in range(self.config.n_layers)]

    def contextualize(self, tokens: torch.Tensor, plan: PackPlan,
                      initial_state: LstmState | None = None, dropout: float = 0.0,
                      backward_tokens: torch.Tensor | None = None, step: LstmStep | None = None
                      ) -> tuple[torch.Tensor, LstmState]:
        """Run both LSTM stacks over token vectors in canonical order: the reference
        forward pass, and training's (inference runs ``packed_runner.PackedRunner``).

        tokens: ``[N, P]``, each sentence's tokens in a row, boundaries included.
        initial_state: per layer ``(h [2, B, P], c [2, B, D])`` in sentence order; zeros if None.
        Returns the LSTM layers ``[L, N, 2P]`` (canonical order; ``[..., :P]`` forward) and
        the state after each sentence's last token, per direction, in sentence order.
        dropout: on each layer's input, while training.
        backward_tokens: ``[N, P]``: the backward stack reads these instead of ``tokens``
        (bilm-tf trains each direction on its own text stream, so truncated
        back-propagation can carry both states across consecutive windows; a query's one
        position runs each direction over its own part: ``query_position``).
        step: runs the recurrence (``LstmStep``; the reference when None or while autograd
        records)."""
        initial_state = initial_state or self.zero_state(len(plan.lengths), tokens.device)
        order, unsort = rank_orders(plan, tokens.device)
        x: torch.Tensor  # [2, N, P]
        if backward_tokens is not None:
            x = torch.stack([tokens[plan.forward_index], backward_tokens[plan.backward_index]])
        else:
            x = packed_input(DistinctInput(tokens, plan.token_index))
        layers = float32_out((self.config.n_layers, plan.n_tokens, self.config.output_dim),
                             tokens)  # [L, N, 2P]
        final_state = []
        for index, (layer, (h0, c0)) in enumerate(zip(self.layers, initial_state, strict=True)):
            layer_in = F.dropout(x, dropout, self.training) if dropout else x
            y, h, c = layer(layer_in, plan, h0[:, order], c0[:, order], step)  # [2, N, P]
            if self.config.has_residual(index):
                y += x  # residual between LSTM layers, not into the first one
            canonical_rows(layers[index], y, plan)
            final_state.append((h[:, unsort], c[:, unsort]))
            x = y
        return layers, final_state

    def forward(self, char_ids: torch.Tensor, initial_state: LstmState | None = None,
                step: LstmStep | None = None) -> BiLMOutput:
        """Tensor API. char_ids ``[B, T, C]`` without sentence boundaries (0 = no token).

        Adds ``<S>``/``</S>`` around each sentence, runs the biLM and strips them again.
        Returns layers ``[L + 1, B, T, 2P]`` (zeros where masked) and the mask ``[B, T]``.
        """
        batch, width, _ = char_ids.shape
        mask = char_ids[..., 0] > 0  # [B, T]
        lengths, device = mask.sum(dim=1).tolist(), char_ids.device
        bos = torch.from_numpy(token_char_ids(BOS_TOKEN, self.config.max_chars)).to(device)
        eos = torch.from_numpy(token_char_ids(EOS_TOKEN, self.config.max_chars)).to(device)
        flat_ids = torch.cat([part for row, n in enumerate(lengths)
                              for part in (bos[None], char_ids[row, :n], eos[None])])  # [N, C]
        plan = PackPlan.build([n + 2 for n in lengths], device)
        tokens = self.token_embedding(flat_ids, step)
        lstm_layers, _ = self.contextualize(tokens, plan, initial_state, step=step)
        all_layers = torch.cat([tokens.repeat(1, 2).unsqueeze(0), lstm_layers])  # [L+1, N, 2P]
        out = all_layers.new_zeros(all_layers.shape[0], batch, width, all_layers.shape[-1])
        start = 0
        for row, n in enumerate(lengths):
            out[:, row, :n] = all_layers[:, start + 1 : start + 1 + n]
            start += n + 2
        return BiLMOutput(out, mask)
