"""Matmuls for CPU inference through oneDNN, on weights reordered once.

torch's CPU ``matmul`` goes to MKL, which copies each call's weight into its own panel
layout before multiplying. The biLM's per-step products multiply a few dozen rows by a
large weight, so that copy, not the arithmetic, sets their pace; oneDNN multiplies by a
weight reordered once into its blocked layout, and the few-row products gain most
(BENCHMARKS.md has the figures).

The ops are torch's own (``torch.ops.mkldnn``, which inductor's CPU backend uses the same
way), but private, so ``onednn_unavailable`` tries them once before a step is chosen;
where they are missing (a torch built without oneDNN) ``auto`` picks the torch step.

``OnednnStep`` is the CPU's default ``LstmStep``: the torch step's in-place recurrence
with these matmuls (in float32, a small layer's products through torch's matmul in place:
``IN_PLACE_MAX_WEIGHT_BYTES``), and the char CNN's highway and projection through them too. Its
packings are kept per model and dtype (``weight_versions.DerivedWeights``) until the
weights change.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from elmo_model.model import BiLstmLayer, CharCNN
from elmo_model.pack_plan import DistinctInput, LayerInput, PackPlan, float32_out
from elmo_model.steps.torch_step import cell_update_
from elmo_model.weight_versions import DerivedWeights


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


def _require(dtype: torch.dtype) -> None:
    missing = onednn_unavailable(dtype)
    if missing is not None:  # choose_step checks the embedder's dtype; this came another way
        raise ValueError(f"the onednn LSTM step cannot run {dtype} here: {missing}")


# Per layer: one (input, recurrent, projection) packing per direction; per char CNN: its
# highways' and projection's. Shared by every step object, so embedders on one model
# share them.
_LAYER_PACKINGS = DerivedWeights()
_CHAR_CNN_PACKINGS = DerivedWeights()
_OUTPUT_PACKINGS = DerivedWeights()  # the in-place path's output projections, per direction


# In float32, a recurrent weight up to this size is multiplied by torch's own matmul
# (MKL) straight into the input projection's rows, in a buffer the step keeps: no new
# gate tensor per time step. oneDNN's products have no output argument, and with the
# pipeline's fixed mmap threshold (pipeline/write/executors.py) each new multi-MB gate
# tensor is freshly zeroed pages (BENCHMARKS.md, "The width cost on the idle machine").
# In place wins up to about this size and loses at the standard model's 32 MB, where
# MKL's per-call copy of the weight costs more than the pages did (BENCHMARKS.md,
# "Figures once in code"). The output projection (``[n, P]``, small) goes through oneDNN
# on every path: with more than one thread MKL splits that product's long reduction over
# threads at some row counts and not at others, so a row's bits would depend on how many
# sentences shared its time step (BENCHMARKS.md, "Same bytes whatever the batch"). Its
# fresh ``[n, P]`` result clipped into the output had cost 2-5x MKL's in-place product at
# the near-free models' small shapes ("The width cost on the idle machine"); on the
# default model the whole step measured 1.03x (within the noise).
IN_PLACE_MAX_WEIGHT_BYTES = 8 << 20


class OnednnStep:
    """``LstmStep``: the in-place recurrence with oneDNN matmuls on weights reordered once,
    one direction after the other: the matmuls are per direction anyway, and only one
    direction's input projections are held at a time.

    In float32 with a recurrent weight of at most ``IN_PLACE_MAX_WEIGHT_BYTES``, the input
    projection goes into a buffer this step keeps between calls and each time step's gates
    are computed in place in its rows (the output projection, ``[n, P]``, through oneDNN),
    so a call allocates no large tensor; one call at a
    time uses the buffer (a lock), as the pipeline's model lock already ensures.
    """

    def __init__(self, in_place_max_bytes: int = IN_PLACE_MAX_WEIGHT_BYTES) -> None:
        self.in_place_max_bytes = in_place_max_bytes
        self._buffer = torch.empty(0)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, int]:  # a copy (deepcopy, pickle) starts empty
        return {"in_place_max_bytes": self.in_place_max_bytes}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(state["in_place_max_bytes"])  # type: ignore[misc]

    def __call__(self, layer: BiLstmLayer, x: LayerInput, plan: PackPlan, h: torch.Tensor,
                 c: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _require(dtype)
        weight = layer.recurrent_weight
        if dtype == torch.float32 and weight[0].numel() * 4 <= self.in_place_max_bytes:
            distinct = x.vectors.shape[0] if isinstance(x, DistinctInput) else 0
            with self._lock:
                return _recurrence(layer, x, plan, h, c,
                                   self._in_place(layer, x.shape[1], distinct), out)
        return _recurrence(layer, x, plan, h, c, _packed(layer, dtype, c.shape[1]), out)

    def _in_place(self, layer: BiLstmLayer, n_tokens: int, n_distinct: int
                  ) -> list[_Direction]:
        """float32, the per-step matmuls in place (see ``IN_PLACE_MAX_WEIGHT_BYTES``);
        ``n_distinct`` rows more for a ``DistinctInput``'s products before they are
        gathered."""
        width = layer.recurrent_weight.shape[-1]  # 4D
        size = (n_tokens + n_distinct) * width
        if self._buffer.numel() < size:
            self._buffer = torch.empty(size)
        pre = self._buffer[: n_tokens * width].view(n_tokens, width)
        output = _OUTPUT_PACKINGS.get(layer, torch.float32, lambda: [
            PackedLinear(layer.projection[k], None) for k in range(2)])
        per_distinct = self._buffer[n_tokens * width : size].view(n_distinct, width)

        def project_input(x_k: torch.Tensor, rows: torch.Tensor | None, k: int
                          ) -> torch.Tensor:
            bias, weight = layer.bias[k].detach(), layer.input_weight[k].detach()
            if rows is None:
                return torch.addmm(bias, x_k.float(), weight, out=pre)
            products = torch.addmm(bias, x_k.float(), weight, out=per_distinct)
            return torch.index_select(products, 0, rows, out=pre)

        return [_Direction(
            lambda x_k, rows, k=k: project_input(x_k, rows, k),
            lambda h_k, rows, k=k: rows.addmm_(h_k, layer.recurrent_weight[k].detach()),
            lambda cell, _, w_proj=w_proj: w_proj(cell))
            for k, w_proj in enumerate(output)]

    def char_cnn_linears(self, char_cnn: CharCNN, dtype: torch.dtype
                         ) -> list[Callable[[torch.Tensor], torch.Tensor]]:
        """The highways' and the projection's maps, packed in ``dtype`` for the char CNN's
        fixed chunk of rows; each takes its input in any dtype."""
        _require(dtype)
        rows = char_cnn.chunk_tokens
        linears = [*(highway.linear for highway in char_cnn.highways), char_cnn.projection]
        packed = _CHAR_CNN_PACKINGS.get(char_cnn, dtype, lambda: [
            PackedLinear(linear.weight.t(), linear.bias, dtype, rows) for linear in linears])
        return [lambda x, f=f: f(x.to(f.dtype)) for f in packed]


@dataclass
class _Direction:
    """One direction's three maps for ``_recurrence``: input projection ``(x [M, P], rows
    [N] or None) -> [N, 4D]`` (bias included; rows ``rows`` of x's products, or all of
    them in order), gates ``(h [n, P], its rows of the projection [n, 4D]) -> [n,
    4D]`` (may write into those rows) and output projection ``(cell [n, D], the output's
    rows [n, P]) -> [n, P]`` (may write into those rows)."""

    project_input: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
    gates: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    project_output: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _packed(layer: BiLstmLayer, dtype: torch.dtype, batch: int) -> list[_Direction]:
    """Every matmul through oneDNN (low precision, or a large recurrent weight)."""
    d = layer.recurrent_weight.shape[-1] // 4
    low = dtype != torch.float32
    packings = _LAYER_PACKINGS.get(layer, dtype, lambda: [
        (PackedLinear(layer.input_weight[k], None if low else layer.bias[k], dtype, 1024),
         PackedLinear(layer.recurrent_weight[k], None, dtype),
         PackedLinear(layer.projection[k], None, dtype))
        for k in range(2)])
    if not low:
        return [_Direction(lambda x_k, rows, w_in=w_in: _rows_of(w_in(x_k.to(dtype)), rows),
                           lambda h_k, rows, w_rec=w_rec: w_rec(h_k, add=rows),
                           lambda cell, _, w_proj=w_proj: w_proj(cell))
                for w_in, w_rec, w_proj in packings]
    # In low precision the input projection has no bias, as ``BiLstmLayer.input_projection``
    # does (rounding x W alone is more accurate); the bias is added in float32 per step.
    flat_gates = torch.empty(max(batch, 2) * 4 * d)  # two rows at least: _never_one_row

    def gates(h_k: torch.Tensor, rows: torch.Tensor, w_rec: PackedLinear, k: int
              ) -> torch.Tensor:
        out = flat_gates[: rows.shape[0] * 4 * d].view(-1, 4 * d)
        return out.copy_(w_rec(h_k.to(dtype))).add_(rows).add_(layer.bias[k])

    return [_Direction(lambda x_k, rows, w_in=w_in: _rows_of(w_in(x_k.to(dtype)), rows),
                       lambda h_k, rows, w_rec=w_rec, k=k: gates(h_k, rows, w_rec, k),
                       lambda cell, _, w_proj=w_proj: w_proj(cell.to(dtype)).float())
            for k, (w_in, w_rec, w_proj) in enumerate(packings)]


def _rows_of(products: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    return products if rows is None else products.index_select(0, rows)


def _never_one_row(product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   a: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``product(a, rows)`` (a ``_Direction`` map: ``a``'s product, which may be written
    into or added to ``rows``), run on two copies of the row when ``a`` has one: with one
    row MKL and oneDNN take a matrix-vector kernel that rounds differently from the
    matrix kernel every other row count gets, so a sentence's vectors would depend on
    whether it ran its last steps alone, i.e. on which sentences shared its batch
    (BENCHMARKS.md, "Same bytes whatever the batch"). Returns what ``product`` would: in
    ``rows`` when it writes there, else a tensor of its own."""
    if a.shape[0] != 1:
        return product(a, rows)
    scratch = rows.expand(2, -1).clone()
    twice = product(a.expand(2, -1).contiguous(), scratch)
    return rows.copy_(twice[:1]) if twice.data_ptr() == scratch.data_ptr() else twice[:1]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread inside: its element-wise kernels cut a tensor into one piece per
    thread, and each piece's last few elements go through a scalar loop whose sigmoid
    rounds differently from the vector loop's; with the cuts where the row count puts
    them, a row's bits would depend on the batch (BENCHMARKS.md, "Same bytes whatever the
    batch"). One piece has its tail at the end of each row, where every batch has it
    (4D and D multiples of 32, the vector loop's step). Setting the count costs ~0.1 us."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# A CPU call of at most this many tokens (a query sentence or a few: the server's and the
# CLI's search) runs on one torch thread. Its per-step products have a row or a few, bound by
# reading the weights, not by arithmetic: a second thread adds a barrier a product, and on a
# busy machine each barrier waits for a descheduled thread (the default model, one 17-token
# sentence at load ~8 on 2 cores: 26 ms CPU on one thread, 190 on two; BENCHMARKS.md, "a
# query's forward pass"). The bytes are the same at any thread count
# (tests/model/test_query_forward.py).
ONE_THREAD_MAX_TOKENS = 256


def threads_for_call(device: torch.device, n_tokens: int
                     ) -> contextlib.AbstractContextManager[None]:
    """``one_thread()`` for a small CPU call (``ONE_THREAD_MAX_TOKENS``), else nothing."""
    if device.type == "cpu" and n_tokens <= ONE_THREAD_MAX_TOKENS:
        return one_thread()
    return contextlib.nullcontext()


def _recurrence(layer: BiLstmLayer, x: LayerInput, plan: PackPlan, h: torch.Tensor,
                c: torch.Tensor, directions: list[_Direction], out: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed time loop, one direction after the other, with ``directions``' maps;
    the output into ``out`` when given. A ``DistinctInput`` is projected once per
    distinct token and the products gathered: on running text a quarter of the rows."""
    batch, d, p = c.shape[1], c.shape[-1], layer.projection.shape[-1]
    like = x.vectors if isinstance(x, DistinctInput) else x
    out = float32_out((2, x.shape[1], p), like, out)
    c = c.clone()  # updated in place; rows that end keep their final value
    final_h = h.clone()
    flat_cell = like.new_empty(batch * d, dtype=torch.float32)
    for k, direction in enumerate(directions):
        pre = (direction.project_input(x.vectors, x.rows[k]) if isinstance(x, DistinctInput)
               else direction.project_input(x[k], None))  # [N, 4D]
        h_k = h[k]
        for t, n in enumerate(plan.batch_sizes):
            if n < h_k.shape[0]:  # sentences of rank >= n just ended: keep their state
                final_h[k, n : h_k.shape[0]] = h_k[n:]
                h_k = h_k[:n]
            start = plan.offsets[t]
            gates = _never_one_row(direction.gates, h_k, pre[start : start + n])  # [n, 4D]
            with one_thread():
                cell = cell_update_(gates, c[k, :n], flat_cell[: n * d].view(n, d),
                                    layer.cell_clip)
            rows = out[k, start : start + n]  # h_k is read from here at the next step
            h_k = _never_one_row(direction.project_output, cell, rows)  # [n, P]
            if h_k.data_ptr() == rows.data_ptr():  # written in place
                h_k = rows.clamp_(-layer.proj_clip, layer.proj_clip) if layer.proj_clip else rows
            elif layer.proj_clip:  # clipped on its way into out: one pass over [n, P], not two
                h_k = torch.clamp(h_k, -layer.proj_clip, layer.proj_clip, out=rows)
            else:
                h_k = rows.copy_(h_k)
        final_h[k, : h_k.shape[0]] = h_k
    return out, final_h, c
