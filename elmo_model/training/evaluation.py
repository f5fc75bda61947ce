"""Held-out perplexity: each held-out line read on its own (stateless), full softmax."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from elmo_model.model import BiLM, LstmState, PackPlan
from elmo_model.training.data import Corpus, embed_types
from elmo_model.training.lm_head import Softmax, perplexity


def contextual_batches(model: BiLM, corpus: Corpus, lines: list[np.ndarray],
                       initial_state: LstmState | None, max_batch_tokens: int
                       ) -> Iterator[tuple[list[int], torch.Tensor]]:
    """The embedder's stateless batching: length-sorted lines grouped under a token
    budget, each line from ``initial_state`` (one ``(h [2, P], c [2, D])`` per layer;
    zeros when None). Yields each batch's line indices and its top LSTM layer
    ``[N, 2P]``, the lines' rows one after another, ``<S>`` and ``</S>`` included.

    Kept apart so it can become a call to the embedder once the embedder yields its
    batches with the boundary rows (``ElmoEmbedder.embed`` drops them, and both ends
    are predictions here).
    """
    device = next(model.parameters()).device
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    batches: list[list[int]] = [[]]
    budget = 0
    for index in order:
        if batches[-1] and budget + len(lines[index]) > max_batch_tokens:
            batches.append([])
            budget = 0
        batches[-1].append(index)
        budget += len(lines[index])
    for batch in batches:
        if not batch:
            continue
        ids = np.concatenate([lines[i] for i in batch])
        plan = PackPlan.build(np.array([len(lines[i]) for i in batch]), device)
        state = None if initial_state is None else [
            (h.to(device)[:, None].expand(-1, len(batch), -1).contiguous(),
             c.to(device)[:, None].expand(-1, len(batch), -1).contiguous())
            for h, c in initial_state]
        layers, _ = model.contextualize(embed_types(model, corpus, ids), plan, state)
        yield batch, layers[-1]


@torch.no_grad()
def heldout_perplexity(model: BiLM, softmax: Softmax, corpus: Corpus,
                       lines: list[np.ndarray] | None = None,
                       initial_state: LstmState | None = None,
                       max_batch_tokens: int = 4096) -> dict[str, float]:
    """Per-direction perplexity of the held-out lines, each read on its own (stateless)
    from ``initial_state`` (zeros when None), with the full softmax.

    Forward predicts tokens 1..n (``w1 .. </S>``) from their left context, backward
    tokens 0..n-1 (``<S> .. wn``) from their right context; ``mean`` is ``exp`` of the
    average of the two directions' mean NLLs (bilm-tf's reported number).
    """
    lines = corpus.heldout if lines is None else lines
    was_training = model.training
    model.eval()
    device = softmax.weight.device
    p = model.config.projection_dim
    totals = {"forward": 0.0, "backward": 0.0}
    count = 0
    for batch, top in contextual_batches(model, corpus, lines, initial_state,
                                         max_batch_tokens):
        ids = np.concatenate([lines[i] for i in batch])
        lengths = np.array([len(lines[i]) for i in batch])
        targets = torch.from_numpy(corpus.softmax_ids[ids]).to(device)
        ends = np.cumsum(lengths)
        # every row but a line's last predicts the next token; every row but its first
        # (read backwards) the previous one
        fwd_rows = torch.from_numpy(np.setdiff1d(np.arange(len(ids)), ends - 1)).to(device)
        bwd_rows = torch.from_numpy(np.setdiff1d(np.arange(len(ids)), ends - lengths)).to(device)
        totals["forward"] += float(softmax.nll(top[fwd_rows, :p], targets[fwd_rows + 1]).sum())
        totals["backward"] += float(softmax.nll(top[bwd_rows, p:], targets[bwd_rows - 1]).sum())
        count += len(fwd_rows)
    model.train(was_training)
    result = {k: perplexity(v, count) for k, v in totals.items()}
    result["mean"] = (perplexity((totals["forward"] + totals["backward"]) / 2, count)
                      if count else float("nan"))
    result["tokens"] = float(count)
    return result
