"""elmo-store's Python entries, one per verb of the ``elmo`` command, which calls them:

    import pipeline
    summary = pipeline.embed(["corpus/*.txt"], "runs/ds", dtype="int8")    # elmo embed
    ds = pipeline.open_dataset("runs/ds")
    ds.to_table(["doc_id", "token"], mix="top")                            # tokens + vector
    ds.sql("SELECT count(*) n FROM tokens")                                # elmo sql
    ix = pipeline.open_index("runs/ds-top.lance")                          # elmo index build
    ix.search("Will you play upon this pipe ?", "play", k=5)               # elmo senses search
    ix.senses("play")                                                      # elmo senses cluster

``pipeline/write/`` is the write path, ``pipeline/lookup/`` the read path and ``schemas/``
the storage contract below both. Importing this package is light: each entry imports
what it needs when called, so ``elmo --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.lookup.api import DatasetReader, IndexReader
    from pipeline.write.embed import EmbedSummary

__all__ = ["embed", "open_dataset", "open_index"]


def embed(sources: str | Sequence[str], out: str, **settings: Any) -> EmbedSummary:
    """Embed every token of the corpus ``sources`` (file, directory or glob URIs) into the
    dataset ``out``, exactly once and resumable; what ``elmo embed`` runs.

    ``settings``: ``EmbedConfig``'s fields (``dtype="float16"``, ``actors=2``,
    ``item_tokens=...``; ``pipeline/write/config.py``), ``ReadOptions``' fields
    (``doc_per="file"``, ``format="jsonl"``, ...), and the model as ``model=DIR`` or
    ``options=FILE, weights=FILE`` (default: the bundled model)."""
    from pipeline.write.embed import config_from_settings, embed_corpus

    return embed_corpus(config_from_settings(sources, out, **settings))


def open_dataset(uri: str, storage_options: dict | None = None) -> DatasetReader:
    """A stored dataset: ``.to_table(columns=None, mix=None)``, ``.sql(query, params=None)``."""
    from pipeline.lookup.api import DatasetReader

    return DatasetReader(uri, storage_options)


def open_index(uri: str) -> IndexReader:
    """A sense index: ``.search(sentence, word, k=10, where=None)``, ``.senses(word)``."""
    from pipeline.lookup.api import IndexReader

    return IndexReader(uri)
