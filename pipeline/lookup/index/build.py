"""Building a sense index (``elmo index build``, the jobs' refresh): the dataset's committed
token files mixed on read, joined to their sentences and documents, added to LanceDB
(``index_rows``), then the vector and scalar indexes and ``_elmo_index.json`` written
(``pipeline/lookup/index/sense_index.py`` describes the index and answers queries on it). Progress:
``index_progress``.
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.doc_fields import field_kinds, indexable_fields, quote, read_documents
from pipeline.lookup.index.build_plan import (
    BuildPlan,
    BuildSettings,
    PublishedIndex,
    plan_build,
)
from pipeline.lookup.index.ivf_build import RETRAIN_GROWTH, build_ivf
from pipeline.lookup.index.ivf_search import current, present
from pipeline.lookup.index.ivf_shards_build import build_shards, shards_current
from pipeline.lookup.index.meta import (
    COMPACT_LAYOUT,
    HNSW_MIN_ROWS,
    LAYOUT,
    SCALAR_COLUMNS,
    STEMMER,
    TABLE,
    VECTOR_DTYPE,
    WORD_COUNTS,
    IndexMeta,
    SearchParams,
    lance_options,
    read_meta,
)
from pipeline.lookup.index.progress import phase, rows_bar
from pipeline.lookup.index.publish import (
    build_file,
    cleanup_age,
    one_build_at_a_time,
    publish,
    published_versions,
    restore_published,
)
from pipeline.lookup.index.rows import (
    BuildSummary,
    IndexTables,
    documents_of,
    file_rows,
    shard_filter,
)
from pipeline.lookup.index.sentences import SENTENCE_KEY, SENTENCES_TABLE
from pipeline.lookup.index.words import (
    SELECTED_WORDS,
    WordSelection,
    read_selected,
    resolve,
    stem_words,
    write_selected,
)
from schemas.dataset import Dataset, open_dataset, open_fs
from schemas.mix_specs import Mix

if TYPE_CHECKING:
    from pipeline.lookup.index.shard_work import ShardRunner

DELETE_BATCH_IDS = 500  # doc ids per delete (a job's refresh): bounds the filter text


def _has_vector_index(table: Any) -> bool:
    return any(getattr(ix, "columns", None) == ["vector"] for ix in table.list_indices())


def _create_vector_index(table: Any, meta: IndexMeta) -> None:
    from lancedb.index import IvfHnswSq

    rows = table.count_rows()
    # 0.3 * sqrt(n) partitions: measured best here (bench/lookup.py, BENCHMARKS.md) at
    # 100k (~100) and 1M (~300) rows; sqrt(n) made recall@10 drop to ~0.92 at nprobes 20.
    partitions = meta.num_partitions or max(1, round(0.3 * rows ** 0.5))
    table.create_index("vector", config=IvfHnswSq(
        distance_type="cosine", num_partitions=partitions, m=meta.m,
        ef_construction=meta.ef_construction), replace=True)
    meta.num_partitions = partitions
    meta.trained_rows = rows


def new_meta(ds: Dataset, dataset: str, the_mix: Mix, kind: str, words: WordSelection,
             vector_dtype: str, documents: dict[str, tuple[list[str], list[dict[str, Any]]]],
             compact: bool = False) -> IndexMeta:
    """The metadata of an index about to be created (its field columns settled now). A
    local dataset is recorded by its absolute path: a compact index reads its vectors from
    there whatever the directory it is opened from."""
    if "://" not in str(dataset):
        dataset = os.path.abspath(dataset)
    return IndexMeta(dataset=str(dataset), model_fingerprint=ds.descriptor.model_fingerprint,
                     mix=the_mix.to_json(), mix_name=the_mix.name, dim=ds.descriptor.dim,
                     kind=kind, stemmer=STEMMER, layout=COMPACT_LAYOUT if compact else LAYOUT,
                     vector_dtype=vector_dtype,
                     words=words.to_json(), compact=compact,
                     # A compact index keeps its documents' fields once, in the dataset's
                     # documents, joined by doc_id (filters, hits), not in every token row.
                     doc_fields={} if compact else indexable_fields(field_kinds(
                         row for _, rows in documents.values() for row in rows)))


@one_build_at_a_time("out")
def build_index(dataset: str, mix: str | Mix, out: str, kind: str = "auto",
                rebuild: bool = False, search: SearchParams | None = None,
                storage_options: dict | None = None,
                progress: Callable[[str], None] | None = None,
                words: WordSelection | None = None, show_progress: bool = False,
                vector_dtype: str = VECTOR_DTYPE, compact: bool | None = None,
                shard_runner: ShardRunner | None = None) -> BuildSummary:
    """Create or extend the index at ``out`` with the dataset's committed shard files:
    ``BuildSettings`` of the arguments (what they mean is said there), planned
    (``plan_build``) and carried out (``execute_build``). ``progress``: a line per step;
    ``show_progress``: bars and phase lines on stderr; ``shard_runner``: what runs a
    compact index's per-shard work (``build_shards``)."""
    settings = BuildSettings(dataset, mix, out, kind=kind, rebuild=rebuild, search=search,
                             storage_options=storage_options, words=words,
                             vector_dtype=vector_dtype, compact=compact)
    # LanceDB logs k-means "empty cluster" warnings to stderr unless told otherwise.
    os.environ.setdefault("LANCEDB_LOG", "error")
    import lancedb

    ds = open_dataset(dataset, storage_options)
    db = lancedb.connect(out, storage_options=lance_options(storage_options))
    plan = plan_build(settings, ds, PublishedIndex.read(out, storage_options, db))
    return execute_build(plan, settings, ds, db, progress, show_progress, shard_runner)


def execute_build(plan: BuildPlan, settings: BuildSettings, ds: Dataset, db: Any,
                  progress: Callable[[str], None] | None = None, show_progress: bool = False,
                  shard_runner: ShardRunner | None = None) -> BuildSummary:
    """Carry ``plan`` out on the LanceDB database ``db`` of the index: the published
    tables back at their versions (or overwritten by a new index), the planned files'
    rows deleted and added, then ``finish_index``, whose ``publish`` is the commit."""
    out, storage_options = plan.out, settings.storage_options
    if plan.why_new and progress:
        progress(plan.why_new)
    fs, root = open_fs(out, storage_options)
    document_files = dict(ds.shard_files("documents"))
    documents: dict[str, tuple[list[str], list[dict[str, Any]]]] = {}
    if plan.extends is not None:
        meta = copy.deepcopy(plan.extends)  # the plan stays as it was made
        restore_published(db, meta, out, progress)
    else:
        # Which metadata fields become columns is settled when the index is created.
        documents = {key: read_documents(ds, path) for key, path in document_files.items()}
        meta = new_meta(ds, settings.dataset, plan.mix, plan.kind, plan.words,
                        settings.vector_dtype, documents, plan.compact)
        selected_words = resolve(plan.words, ds)
        if selected_words is not None:
            meta.selected_file = build_file(SELECTED_WORDS)
            write_selected(fs, root, selected_words, meta.selected_file)
    meta.kind = plan.kind
    if settings.search is not None:
        meta.search, meta.search_auto = settings.search, False
    selected = None if meta.selection().everything else read_selected(fs, root,
                                                                     meta.selected_file)
    summary = BuildSummary(out=out, skipped_files=plan.kept)
    sentence_files = dict(ds.shard_files("sentences"))
    # A new index overwrites the tables (a new LanceDB version): the published one stays
    # readable at its versions until this build's commit (``publish``).
    tables = IndexTables(db, overwrite=plan.creates)
    for start in range(0, len(plan.delete_docs), DELETE_BATCH_IDS):
        batch = plan.delete_docs[start:start + DELETE_BATCH_IDS]
        tables.delete(f"doc_id IN ({', '.join(quote(i) for i in batch)})")
    for key in plan.delete:
        tables.delete(shard_filter(key))
        meta.indexed.remove(key)
        summary.removed_files += 1
    total = file_rows(ds, [path for _, path in plan.add]) if show_progress else 0
    if progress and plan.add and not meta.selection().everything:
        progress(f"keeping {meta.selection().describe()}")
    with rows_bar(total, show_progress) as bar:
        for key, path in plan.add:
            # A run killed after an add but before its metadata write leaves rows that no
            # metadata lists: drop them, so that a row is never held twice.
            tables.delete(shard_filter(key))
            n_rows = tables.add_file(ds, plan.mix, path, key, sentence_files.get(key),
                                     documents_of(ds, key, document_files, documents), meta,
                                     selected, summary, bar.update)
            if key not in meta.indexed:
                meta.indexed.append(key)
            if progress and not show_progress:
                progress(f"{key}: {n_rows} rows")
    if tables.tokens is None:
        raise ElmoUserError(f"{settings.dataset} has no committed token rows to index"
                            + ("" if selected is None else f" of {meta.selection().describe()}"))
    return finish_index(tables, meta, summary, out, storage_options, show_progress,
                        fresh=plan.creates, shard_runner=shard_runner)


def _scalar_indexes(table: Any, columns: tuple[str, ...]) -> None:
    from lancedb.index import BTree

    has_scalar = {tuple(ix.columns) for ix in table.list_indices()}
    for column in columns:
        if (column,) not in has_scalar:
            # BTree, not Bitmap: a corpus vocabulary has far too many values for bitmaps.
            table.create_index(column, config=BTree())


def _optimize(table: Any, keep: int | None, drop_old_versions: bool) -> None:
    """Compaction and index merging; versions before ``keep`` (the published one, which
    readers may hold until this build commits) are removed, or with ``drop_old_versions``
    (an index no one has opened yet) all but the latest."""
    with warnings.catch_warnings():  # LanceDB warns of readers of those versions
        warnings.simplefilter("ignore", UserWarning)
        table.optimize(cleanup_older_than=cleanup_age(table, keep, drop_old_versions))


def finish_index(tables: IndexTables, meta: IndexMeta, summary: BuildSummary, out: str,
                 storage_options: dict | None = None, show_progress: bool = False,
                 fresh: bool = False, shard_runner: ShardRunner | None = None
                 ) -> BuildSummary:
    """After rows were added or deleted: scalar and vector indexes, word counts, search
    parameters and the metadata (``meta.indexed`` already says what the table holds).
    ``fresh``: the index was created by this build; ``shard_runner``: ``build_shards``'."""
    t0 = time.perf_counter()
    table = tables.tokens
    published = read_meta(out, storage_options)
    kept = published_versions(published) if published is not None else {}
    meta.rows = table.count_rows()
    want_hnsw = meta.kind == "hnsw" or (meta.kind == "auto" and meta.rows >= HNSW_MIN_ROWS)
    changed = bool(summary.added_rows or summary.removed_files)
    with phase("index: scalar indexes" + (", optimize" if changed else ""), show_progress):
        _scalar_indexes(table, SCALAR_COLUMNS)
        if tables.sentences is not None:
            _scalar_indexes(tables.sentences, SENTENCE_KEY)
        if changed:
            # Compacts the new fragments and folds them into the existing indexes (vector
            # and scalar) instead of retraining them. A new index's earlier versions (its
            # rows before compaction, about its size again) are open to no reader yet:
            # they go, before the vector index is trained. Otherwise the published
            # version and those after it stay (a server may be reading it; ``publish``).
            for name, each in ((TABLE, table), (SENTENCES_TABLE, tables.sentences)):
                if each is not None:
                    _optimize(each, kept.get(name), fresh and published is None)
    grown = meta.trained_rows and meta.rows > RETRAIN_GROWTH * meta.trained_rows
    if want_hnsw and not meta.compact and (not _has_vector_index(table) or grown):
        # First index, or the data outgrew the partitions it was trained with: (re)train.
        if grown:
            meta.num_partitions = None
        with phase(f"index: IVF_HNSW_SQ over {meta.rows} rows (LanceDB shows no progress)",
                   show_progress):
            _create_vector_index(table, meta)
    meta.built = "ivf" if meta.compact else "hnsw" if _has_vector_index(table) else "flat"
    if meta.search_auto:
        meta.search = SearchParams.for_rows(meta.rows)
    if changed or meta.counted_rows != meta.rows or meta.word_counts_file is None:
        meta.word_counts_file = build_file(WORD_COUNTS)
        _write_word_counts(table, meta.rows, out, meta.word_counts_file, storage_options)
        meta.counted_rows = meta.rows
    fs, root = open_fs(out, storage_options)
    if meta.built == "flat":
        meta.ivf = None
    elif meta.compact:
        if not shards_current(fs, root, meta.ivf, meta.indexed):
            ds = open_dataset(meta.dataset, storage_options)
            meta.ivf = summary.ivf = build_shards(
                table, fs, root, meta, ds, dict(ds.shard_files("tokens")), show_progress,
                shard_runner, tables.sentences)
        meta.ivf["table_version"] = table.version
    elif not (current(meta.ivf, table.version) and present(fs, root, meta.ivf)):
        # The table changed (or never had one): the in-memory IVF follows it.
        meta.ivf = summary.ivf = build_ivf(table, fs, root, show_progress,
                                              previous=meta.ivf)
    summary.seconds_index = time.perf_counter() - t0
    summary.rows, summary.built = meta.rows, meta.built
    publish(out, meta, tables.versions(), storage_options)
    return summary


def _write_word_counts(table: Any, rows: int, out: str, name: str,
                       storage_options: dict | None) -> None:
    import io

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from schemas.dataset import write_bytes_atomic

    # Batch by batch, so memory follows the vocabulary, not the corpus.
    total: dict[str, int] = {}
    reader = table.search().select(["token_lower"]).limit(max(1, rows)) \
        .to_batches(batch_size=1 << 20)
    for batch in reader:
        counted = pc.value_counts(batch.column("token_lower"))
        for word, n in zip(counted.field("values").to_pylist(),
                           counted.field("counts").to_pylist(), strict=True):
            total[word] = total.get(word, 0) + n
    counts = pa.table({"token_lower": pa.array(list(total), pa.string()),
                       "token_stem": pa.array(stem_words(list(total)), pa.string()),
                       "rows": pa.array(list(total.values()), pa.int64())})
    body = io.BytesIO()
    pq.write_table(counts, body, compression="zstd")
    fs, root = open_fs(out, storage_options)
    write_bytes_atomic(fs, f"{root}/{name}", body.getvalue())


# --------------------------------------------------------------------------- searching
