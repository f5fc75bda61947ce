"""The biLM's LSTM stacks as the embedder runs them for inference: into packed buffers it
reuses per batch, the first layer reading each distinct token once, and, for a
quantizer that adds as it reads, the last residual connection left undone.

``BiLM.contextualize`` is the reference (and training's forward): this runner gives its
layers and states bit for bit where it reads the same tokens (tests/model/
test_packed_runner.py). What the runner may be asked is typed, so that no invalid mix of
speed settings can be written: ``CanonicalLayers`` returns the layers in sentence order,
``PackedLayers`` leaves them where the recurrence wrote them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from elmo_model.model import BiLM, LstmState, LstmStep, canonical_rows, rank_orders
from elmo_model.pack_plan import DistinctInput, LayerInput, PackPlan, float32_out, packed_input


@dataclass(frozen=True)
class CanonicalLayers:
    """Return the LSTM layers ``[L, N, 2P]`` float32 in canonical order (sentence after
    sentence, ``[..., :P]`` forward), written into ``out`` when given (the caller's own
    ``[L + 1, N, 2P]`` less its layer 0, so no second copy of every layer is made)."""

    out: torch.Tensor | None = None


@dataclass(frozen=True)
class PackedLayers:
    """Return no canonical layers: the caller reads each from its packed buffer (``plan``
    says where each row is). ``last_residual=False``: the last layer's buffer keeps the
    layer's own output and the caller adds the buffer before it as it reads (where that
    layer has a residual connection): one pass over the layer less."""

    last_residual: bool = True


LayerOutput = CanonicalLayers | PackedLayers


@dataclass(frozen=True)
class PackedRunner:
    """``model``'s LSTM stacks run by ``step`` (an ``LstmStep``: the embedder's choice) over
    a batch, under ``torch.inference_mode`` or ``no_grad``."""

    model: BiLM
    step: LstmStep

    def run(self, tokens: torch.Tensor, plan: PackPlan, buffers: Sequence[torch.Tensor],
            initial_state: LstmState | None = None, token_rows: torch.Tensor | None = None,
            output: LayerOutput = CanonicalLayers()
            ) -> tuple[torch.Tensor | None, LstmState]:
        """Run both stacks; returns the layers (``CanonicalLayers``; None for
        ``PackedLayers``) and each sentence's state after its last token, as
        ``BiLM.contextualize`` does.

        tokens: ``[N, P]`` in canonical order, boundaries included; with ``token_rows``
        (``[N]``) each distinct token once, position ``i`` reading row ``token_rows[i]``.
        buffers: L + 1 float32 ``[2, N, P]``: the packed input goes into the first (left
        alone with ``token_rows``: the first layer reads the distinct rows,
        ``DistinctInput``), layer j's packed output into buffer j."""
        model = self.model
        n_layers = model.config.n_layers
        if len(buffers) != n_layers + 1:
            raise ValueError(f"buffers must be {n_layers + 1} packed layers, got {len(buffers)}")
        initial_state = initial_state or model.zero_state(len(plan.lengths), tokens.device)
        order, unsort = rank_orders(plan, tokens.device)
        x: LayerInput  # [2, N, P]
        if token_rows is not None:
            x = DistinctInput(tokens, token_rows[plan.token_index])
        else:
            x = packed_input(DistinctInput(tokens, plan.token_index), buffers[0])
        layers = None
        if isinstance(output, CanonicalLayers):
            layers = float32_out((n_layers, plan.n_tokens, model.config.output_dim), tokens,
                                 output.out)  # [L, N, 2P]
        skip_last = isinstance(output, PackedLayers) and not output.last_residual
        final_state = []
        for index, (layer, (h0, c0)) in enumerate(zip(model.layers, initial_state, strict=True)):
            y, h, c = layer(x, plan, h0[:, order], c0[:, order], self.step, buffers[index + 1])
            if model.config.has_residual(index) and not (skip_last and index == n_layers - 1):
                y += x  # residual between LSTM layers, not into the first one
            if layers is not None:
                canonical_rows(layers[index], y, plan)
            final_state.append((h[:, unsort], c[:, unsort]))
            x = y
        return layers, final_state
