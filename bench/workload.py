"""What the biLM benchmarks embed: the model shapes and running text. Imports nothing of
``elmo_model`` beyond ``BiLMConfig``, so ``compare_trees.py`` can feed the same batches to
trees of any age."""

from __future__ import annotations

import re
from pathlib import Path

from elmo_model import BiLMConfig

CONFIGS = {
    "standard": BiLMConfig(),
    "small": BiLMConfig(
        lstm_dim=1024,
        projection_dim=128,
        filters=((1, 32), (2, 32), (3, 64), (4, 128)),
        n_highway=1,
    ),
}
CORPORA = Path(__file__).resolve().parent.parent.parent / "shared" / "corpora"
_TOKEN = re.compile(r"\w+|[^\w\s]")


def running_text(
    n_sentences: int, skip: int, min_len: int = 8, max_len: int = 40
) -> list[list[str]]:
    """Consecutive lines of Austen and Melville, crudely tokenized, of moderate length."""
    lines = (CORPORA / "austen.txt").read_text(encoding="utf-8").splitlines()
    lines += (CORPORA / "moby_dick.txt").read_text(encoding="utf-8").splitlines()
    out: list[list[str]] = []
    for line in lines[skip:]:
        tokens = _TOKEN.findall(line)
        if min_len <= len(tokens) <= max_len:
            out.append(tokens)
        elif len(tokens) > max_len:
            out.append(tokens[:max_len])
        if len(out) == n_sentences:
            break
    return out
