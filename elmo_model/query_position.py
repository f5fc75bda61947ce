"""One token's layers of a sentence, with about half the recurrence of the whole sentence.

A search asks for the vector of one position ``i`` of its query sentence. The forward
LSTM's output there depends only on ``<S> t0 .. ti`` and the backward one's only on
``</S> tn-1 .. ti`` (read backwards), at every layer: the two directions never meet
before the output. So each direction runs over its own part: both parts packed as one
sequence of ``max`` of their lengths, the shorter part padded at its end (steps after the
position's, whose outputs are not read), through the reference forward pass
(``BiLM.contextualize``, the backward stack reading its own tokens). For a middle word
that is about half the steps of the whole sentence.

The vectors are the embedder's for the same sentence bit for bit (each direction's row
at a step is what the whole sentence's run gives there: the same step, the same maps,
the same state at every earlier step; tests/model/test_query_forward.py checks it).
"""

from __future__ import annotations

import numpy as np
import torch

from elmo_model.char_ids import BOS_TOKEN, EOS_TOKEN
from elmo_model.embedder import ElmoEmbedder
from elmo_model.errors import ElmoUserError
from elmo_model.pack_plan import PackPlan
from elmo_model.steps.onednn import threads_for_call


@torch.inference_mode()
def position_layers(embedder: ElmoEmbedder, tokens: list[str], position: int
                    ) -> np.ndarray:
    """``embedder.embed([tokens])[0][:, position]``: the ``[L + 1, 2P]`` float32 layers
    of token ``position``, running each direction only as far as that token."""
    if embedder.mode != "stateless":
        raise ElmoUserError("one position's layers need the stateless mode")
    if not 0 <= position < len(tokens):
        raise ElmoUserError(f"position {position} is outside a sentence of {len(tokens)} "
                            "tokens")
    model, width = embedder.model, embedder.config.projection_dim
    at = position + 1  # with <S> first
    forward_length, backward_length = at + 1, len(tokens) + 1 - position
    steps = max(forward_length, backward_length)
    out = np.empty((embedder.config.n_layers + 1, 2 * width), np.float32)
    flat = [BOS_TOKEN, *tokens, EOS_TOKEN]
    with (embedder.call_lock, threads_for_call(embedder.device, 2 * steps),
          embedder.autocast()):
        _, vectors, rows = embedder.token_vectors(flat)  # [U, P], [N]
        forward = _padded(rows[: at + 1], steps)  # <S>, t0, ..., ti
        # in canonical order: the backward stack reads it reversed, </S>, tn-1, ..., ti
        backward = _padded(rows[at:].flip(0), steps).flip(0)
        out[0, :width] = out[0, width:] = vectors[rows[at]].cpu().numpy()
        plan = PackPlan.build(np.array([steps]), embedder.device)
        layers, _ = model.contextualize(vectors[forward], plan, embedder.start_state(1),
                                        backward_tokens=vectors[backward],
                                        step=embedder.step)  # [L, steps, 2P]
        out[1:, :width] = layers[:, forward_length - 1, :width].cpu().numpy()
        out[1:, width:] = layers[:, steps - backward_length, width:].cpu().numpy()
    return out


def _padded(rows: torch.Tensor, length: int) -> torch.Tensor:
    if rows.shape[0] == length:
        return rows
    return torch.cat([rows, rows[-1:].expand(length - rows.shape[0])])
