"""Held-out perplexity: each held-out line read on its own (stateless), full softmax."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from elmo_model.embedder import expand_state
from elmo_model.lstm_steps import choose_step
from elmo_model.model import BiLM, LstmState, PackPlan
from elmo_model.pack_plan import stateless_batches
from elmo_model.training.data import Corpus, embed_types
from elmo_model.training.lm_head import Softmax, perplexity

Line = TypeVar("Line")


def spread_sample(lines: Sequence[Line], count: int) -> list[Line]:
    """``count`` of ``lines`` at even steps from the first: held-out lines come file by
    file (one source a file in the corpus recipe), so this sample weighs each source by its
    share of them, where the first ``count`` lines would all be the first file's."""
    if count >= len(lines):
        return list(lines)
    step = len(lines) / count
    return [lines[int(i * step)] for i in range(count)]


def contextual_batches(model: BiLM, corpus: Corpus, lines: list[np.ndarray],
                       initial_state: LstmState | None, max_batch_tokens: int
                       ) -> Iterator[tuple[list[int], torch.Tensor]]:
    """The embedder's stateless batches (``stateless_batches``, ``expand_state``) over
    type-id lines that already hold ``<S>`` and ``</S>`` (both ends are predictions here,
    where ``ElmoEmbedder.embed`` drops them). Yields each batch's line indices and its top
    LSTM layer ``[N, 2P]``, the lines' rows one after another.

    The weights changed in place since the last evaluation (optimizer steps), so they are
    declared changed before the fast inference step derives its copies from them.
    """
    device = next(model.parameters()).device
    model.weights_changed()
    step = choose_step("auto", device, torch.float32).step
    state = None if initial_state is None else [
        (h.to(device), c.to(device)) for h, c in initial_state]
    for batch in stateless_batches([len(line) for line in lines], max_batch_tokens):
        ids = np.concatenate([lines[i] for i in batch])
        plan = PackPlan.build(np.array([len(lines[i]) for i in batch]), device)
        tokens = embed_types(model, corpus, ids)
        layers, _ = model.contextualize(tokens, plan, expand_state(state, len(batch)),
                                        step=step)
        yield batch, layers[-1]


@torch.no_grad()
def heldout_perplexity(model: BiLM, softmax: Softmax, corpus: Corpus,
                       lines: list[np.ndarray] | None = None,
                       initial_state: LstmState | None = None,
                       max_batch_tokens: int = 4096,
                       files: Sequence[str] | None = None) -> dict[str, Any]:
    """Per-direction perplexity of the held-out lines, each read on its own (stateless)
    from ``initial_state`` (zeros when None), with the full softmax.

    Forward predicts tokens 1..n (``w1 .. </S>``) from their left context, backward
    tokens 0..n-1 (``<S> .. wn``) from their right context; ``mean`` is ``exp`` of the
    average of the two directions' mean NLLs (bilm-tf's reported number). With ``files``
    (each line's file, a source in the corpus recipe) the same figures per file are under
    ``by_file``.
    """
    lines = corpus.heldout if lines is None else lines
    was_training = model.training
    model.eval()
    device = softmax.weight.device
    p = model.config.projection_dim
    names = sorted(set(files)) if files is not None else [""]
    group = (np.searchsorted(names, np.asarray(files)) if files is not None
             else np.zeros(len(lines), np.int64))
    totals = {d: np.zeros(len(names)) for d in ("forward", "backward")}
    counts = np.zeros(len(names))
    for batch, top in contextual_batches(model, corpus, lines, initial_state,
                                         max_batch_tokens):
        ids = np.concatenate([lines[i] for i in batch])
        lengths = np.array([len(lines[i]) for i in batch])
        targets = torch.from_numpy(corpus.softmax_ids[ids]).to(device)
        ends = np.cumsum(lengths)
        row_group = np.repeat(group[batch], lengths)  # each row's line's file
        # every row but a line's last predicts the next token; every row but its first
        # (read backwards) the previous one
        fwd = np.setdiff1d(np.arange(len(ids)), ends - 1)
        bwd = np.setdiff1d(np.arange(len(ids)), ends - lengths)
        fwd_rows, bwd_rows = torch.from_numpy(fwd).to(device), torch.from_numpy(bwd).to(device)
        for direction, rows, nll in (
                ("forward", fwd, softmax.nll(top[fwd_rows, :p], targets[fwd_rows + 1])),
                ("backward", bwd, softmax.nll(top[bwd_rows, p:], targets[bwd_rows - 1]))):
            totals[direction] += np.bincount(row_group[rows], nll.double().cpu().numpy(),
                                             minlength=len(names))
        counts += np.bincount(row_group[fwd], minlength=len(names))
    model.train(was_training)

    def figures(forward: float, backward: float, count: float) -> dict[str, float]:
        return {"forward": perplexity(forward, count), "backward": perplexity(backward, count),
                "mean": perplexity((forward + backward) / 2, count), "tokens": float(count)}

    result: dict[str, Any] = figures(totals["forward"].sum(), totals["backward"].sum(),
                                     counts.sum())
    if files is not None:
        result["by_file"] = {name: figures(totals["forward"][g], totals["backward"][g],
                                           counts[g]) for g, name in enumerate(names)}
    return result
