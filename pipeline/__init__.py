"""elmo-store's Python entries, one per verb of the ``elmo`` command, which calls them:

    import pipeline
    summary = pipeline.embed(["corpus/*.txt"], "runs/ds", dtype="int8")    # elmo embed
    ds = pipeline.open_dataset("runs/ds")
    ds.to_table(["doc_id", "token"], mix="top", filter="token=play")      # tokens + vector
    ds.sql("SELECT count(*) n FROM tokens").fetchall()                     # elmo sql
    ix = pipeline.build_index(ds, "runs/ds-top.lance", mix="top")          # elmo index build
    ix = pipeline.open_index("runs/ds-top.lance")                          # an index built before
    ix.search("Will you play upon this pipe ?", "play", k=5)               # elmo senses search
    ix.senses("play")                                                      # elmo senses cluster
    ix.change("year", bin=25)                                              # elmo senses change

``pipeline/write/`` is the write path, ``pipeline/lookup/`` the read path and ``schemas/``
the storage contract below both. Importing this package is light: each entry imports
what it needs when called, so ``elmo --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Unpack

    from pipeline.lookup.api import DatasetReader, IndexReader
    from pipeline.write.config import EmbedSettings, ModelSpec
    from pipeline.write.embed import EmbedSummary
    from pipeline.write.inputs import ReadOptions

__all__ = ["build_index", "embed", "open_dataset", "open_index"]


def embed(sources: str | Sequence[str], out: str, *, model: str | ModelSpec | None = None,
          options: str | None = None, weights: str | None = None,
          read: ReadOptions | None = None, **settings: Unpack[EmbedSettings]
          ) -> EmbedSummary:
    """Embed every token of the corpus ``sources`` (file, directory or glob URIs) into the
    dataset ``out``, exactly once and resumable; what ``elmo embed`` runs.

    ``model``: a model directory (default: the bundled model), or AllenNLP's ``options``
    and ``weights`` files. ``settings``: ``EmbedConfig``'s fields (``dtype="float16"``,
    ``actors=2``, ``item_tokens=...``; ``pipeline/write/config.py``) and ``ReadOptions``'
    fields (``doc_per="file"``, ``format="jsonl"``, ...), or ``read=ReadOptions(...)``."""
    from pipeline.write.embed import config_from_settings, embed_corpus

    given = {"model": model, "options": options, "weights": weights, "read": read}
    return embed_corpus(config_from_settings(
        sources, out, **{k: v for k, v in given.items() if v is not None}, **settings))


def open_dataset(uri: str, storage_options: dict | None = None) -> DatasetReader:
    """A stored dataset: ``.schema``, ``.count_rows(filter=None)``,
    ``.to_table(columns=None, filter=None, mix=None)``, ``.to_batches(...)`` and
    ``.sql(query, params=None)`` (a DuckDB relation). ``storage_options``: fsspec's, for
    a dataset on S3 or another remote store; every read, SQL included, goes through them."""
    from pipeline.lookup.api import DatasetReader

    return DatasetReader(uri, storage_options)


def open_index(uri: str, storage_options: dict | None = None) -> IndexReader:
    """A sense index: ``.search(sentence, word=None, k=10, any_word=False, where=None,
    exact=False)``, ``.senses(word)``, ``.change(by, bin=None)``."""
    from pipeline.lookup.api import IndexReader

    return IndexReader(uri, storage_options)


def build_index(dataset: str | DatasetReader, out: str, *, mix: str = "top",
                compact: bool | None = None, kind: str = "auto",
                words: Sequence[str] | None = None, min_count: int | None = None,
                max_count: int | None = None, rebuild: bool = False,
                storage_options: dict | None = None, progress: bool = False
                ) -> IndexReader:
    """Index a dataset's ``mix`` at ``out`` (created, or extended with the shards added
    since) and open it; what ``elmo index build`` runs. ``compact`` (the default for a
    new index): keep codes, not vectors; ``kind``: a full index's vector index (``auto``,
    ``hnsw``, ``flat``); ``words``, ``min_count``, ``max_count``: which words it holds;
    ``progress``: bars on stderr."""
    from pipeline.lookup.api import DatasetReader, IndexReader
    from pipeline.lookup.index.build import build_index as build
    from pipeline.lookup.index.words import WordSelection

    if isinstance(dataset, DatasetReader):
        dataset, storage_options = dataset.uri, dataset.stored.storage_options
    selection = WordSelection(list(words) if words is not None else None, min_count,
                              max_count)
    summary = build(dataset, mix, out, kind=kind, rebuild=rebuild,
                    storage_options=storage_options, words=selection,
                    show_progress=progress, compact=compact)
    return IndexReader(summary.out, storage_options)
