"""Tokenization for the pipeline: the tokenizer registry and long-sentence windows.

The tokenizers live in :mod:`elmo_model.tokenizers` (a model and the tokenizer it was
trained with belong together, and ``elmo train`` needs them without the pipeline); this
module re-exports them for the pipeline, sense search and the CLI:

- ``get_tokenizer(name)``, ``tokenizer_names()``: ``moses``, ``elmo-store-words``,
  ``elmo-store-ptb``. Every tokenizer gives exact code-point offsets:
  ``token.text == doc[token.start:token.end]``.
- ``model_tokenizer(options_path)``: the name a model declares in its ``options.json``
  (``"tokenizer": {"name": ..., "version": ...}``); ``moses`` for AllenNLP/bilm-tf
  weights, which declare nothing.

Sentences longer than
``max_tokens`` are cut into overlapping windows for the model (see ``windows``), but
stored as one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

from elmo_model.tokenizers import (
    Sentence,
    Token,
    Tokenizer,
    get_tokenizer,
    model_tokenizer,
    tokenizer_names,
)

__all__ = [
    "Sentence",
    "Token",
    "Tokenizer",
    "Window",
    "get_tokenizer",
    "model_tokenizer",
    "tokenizer_names",
    "windows",
]


@dataclass(frozen=True)
class Window:
    """Tokens ``[start, end)`` of a sentence go through the model together; only the
    tokens ``[own_start, own_end)`` are stored from this window, so each token is stored
    exactly once, from the window in which it has the most context on both sides."""

    start: int
    end: int
    own_start: int
    own_end: int


def windows(n_tokens: int, max_tokens: int, overlap: int) -> list[Window]:
    """Cover ``n_tokens`` with windows of at most ``max_tokens`` overlapping by ``overlap``.

    Where two windows overlap, the first half of the overlap is owned by the earlier
    window and the second half by the later one.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    if not 0 <= overlap < max_tokens:
        raise ValueError("overlap must be >= 0 and < max_tokens")
    if n_tokens <= max_tokens:
        return [Window(0, n_tokens, 0, n_tokens)]
    step = max_tokens - overlap
    starts = sorted({*range(0, n_tokens - max_tokens, step), n_tokens - max_tokens})
    out = []
    for k, start in enumerate(starts):
        end = start + max_tokens
        own_start = 0 if k == 0 else out[-1].own_end
        if k + 1 < len(starts):
            next_start = starts[k + 1]
            own_end = next_start + (end - next_start) // 2
        else:
            own_end = n_tokens
        out.append(Window(start, end, own_start, own_end))
    return out
