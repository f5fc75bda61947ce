"""Building a sense index (``elmo index build``, the jobs' refresh): the dataset's committed
token files mixed on read, joined to their sentences and documents, added to LanceDB, then
the vector and scalar indexes and ``_elmo_index.json`` written (``pipeline/lookup/index.py``
describes the index and answers queries on it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.dataset import Dataset, open_dataset, open_fs
from pipeline.lookup.doc_fields import (
    field_kinds,
    index_field_arrays,
    indexable_fields,
    quote,
    read_documents,
)
from pipeline.lookup.index import (
    HNSW_MIN_ROWS,
    INDEX_KINDS,
    INDEX_META,
    SCALAR_COLUMNS,
    STEMMER,
    TABLE,
    WORD_COUNTS,
    IndexMeta,
    SearchParams,
    lance_options,
    read_meta,
    stem_words,
)
from pipeline.lookup.mix_specs import Mix
from pipeline.lookup.mixes import iter_mixed

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class BuildSummary:
    out: str
    added_files: int = 0
    skipped_files: int = 0
    removed_files: int = 0
    added_rows: int = 0
    rows: int = 0
    built: str = "flat"
    seconds_read: float = 0.0
    seconds_add: float = 0.0
    seconds_index: float = 0.0

    def line(self) -> str:
        total = self.seconds_read + self.seconds_add + self.seconds_index
        return (f"index {self.out}: +{self.added_rows} rows from {self.added_files} shard "
                f"files ({self.skipped_files} already in, {self.removed_files} removed), "
                f"{self.rows} rows, vector index {self.built}; {total:.1f} s (mix+read "
                f"{self.seconds_read:.1f}, add {self.seconds_add:.1f}, index "
                f"{self.seconds_index:.1f})")


def _write_meta(out: str, meta: IndexMeta, storage_options: dict | None = None) -> None:
    from pipeline.store import write_bytes_atomic

    fs, root = open_fs(out, storage_options)
    write_bytes_atomic(fs, f"{root}/{INDEX_META}", meta.to_json().encode())


def _sentence_lookup(ds: Dataset, path: str | None) -> pa.Table:
    """The sentences of one shard file (the live view names it; None: no sentence rows)."""
    import pyarrow.parquet as pq

    from schemas import SENTENCE_SCHEMA

    columns = ["doc_id", "sent_idx", "text", "char_start"]
    if path is None:
        return SENTENCE_SCHEMA.empty_table().select(columns)
    with ds.fs.open(path, "rb") as handle:
        return pq.read_table(handle, columns=columns, page_checksum_verification=True)


def _split_key(key: str) -> tuple[str, int]:
    part, shard, _ = key.split("/")
    return part, int(shard.split("=", 1)[1])


def shard_filter(key: str) -> str:
    part, shard = _split_key(key)
    return f"part = {quote(part)} AND shard = {shard}"


ADD_BYTES = 256 << 20  # float32 vectors per LanceDB add: bounds memory for any shard size


def rows_for_file(ds: Dataset, mix: Mix, path: str, key: str, sentences_path: str | None,
                   documents: tuple[list[str], list[dict[str, Any]]],
                   doc_fields: dict[str, str]) -> Iterator[pa.Table]:
    """Index rows of one committed tokens file, in chunks (vectors mixed on read), with
    their documents' fields (``documents``: its documents file, ``read_documents``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    dim = ds.descriptor.dim
    part, shard = _split_key(key)
    sentences = _sentence_lookup(ds, sentences_path).rename_columns(
        ["doc_id", "sent_idx", "sentence", "sent_start"])
    cols = ("doc_id", "sent_idx", "tok_idx", "token", "char_start", "char_end")
    chunk_rows = max(4096, ADD_BYTES // (4 * dim))
    for batch, vec in iter_mixed(ds, mix, columns=cols, files=[path], batch_rows=chunk_rows):
        n = batch.num_rows
        meta = pa.Table.from_batches([batch]).append_column(
            "_row", pa.array(np.arange(n), pa.int64()))
        # Arrow's hash join reorders rows: "_row" puts them back in step with the vectors.
        joined = meta.join(sentences, keys=["doc_id", "sent_idx"], join_type="left outer")
        joined = joined.sort_by("_row")
        if joined.num_rows != n:
            raise ElmoUserError(f"{path}: tokens and sentences disagree (duplicate sentences)")
        sent_start = pc.fill_null(joined["sent_start"], 0)
        lower = pc.utf8_lower(joined["token"]).combine_chunks()
        vocabulary = pc.unique(lower)  # stem each word type once, not each token
        stems = pa.array(stem_words(vocabulary.to_pylist()), pa.string())
        yield pa.table({
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), dim),
            "token": joined["token"],
            "token_lower": lower,
            "token_stem": stems.take(pc.index_in(lower, value_set=vocabulary)),
            "doc_id": joined["doc_id"],
            "sent_idx": joined["sent_idx"],
            "tok_idx": joined["tok_idx"],
            "part": pa.array([part] * n, pa.string()),
            "shard": pa.array(np.full(n, shard, np.int32)),
            "sentence": pc.fill_null(joined["sentence"], ""),
            "start": pc.subtract(joined["char_start"], sent_start).cast(pa.int32()),
            "end": pc.subtract(joined["char_end"], sent_start).cast(pa.int32()),
            **index_field_arrays(joined["doc_id"].combine_chunks(), documents, doc_fields),
        })


def documents_of(ds: Dataset, key: str, files: dict[str, str],
                  read: dict[str, tuple[list[str], list[dict[str, Any]]]]
                  ) -> tuple[list[str], list[dict[str, Any]]]:
    """The documents of shard file ``key`` (already ``read``, else read now)."""
    if key not in read:
        read[key] = read_documents(ds, files[key]) if key in files else ([], [])
    return read[key]


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


def reusable_meta(ds: Dataset, the_mix: Mix, out: str, storage_options: dict | None,
                  progress: Callable[[str], None] | None) -> IndexMeta | None:
    """The metadata of the index at ``out`` if new rows can be added to it; None when it
    must be built again (its rows lack word stems or document fields). An index of
    another model or mix is refused: the user chooses ``--rebuild`` or another ``--out``."""
    meta = read_meta(out, storage_options)
    if meta is None:
        return None
    if meta.model_fingerprint != ds.descriptor.model_fingerprint:
        raise ElmoUserError(f"{out} indexes a dataset of another model; use --rebuild "
                            "or another --out")
    if not meta.the_mix().same_vectors(the_mix):
        raise ElmoUserError(f"{out} holds mix {meta.mix_name!r} ({meta.the_mix().describe()}); "
                            f"asked for {the_mix.describe()}: use --rebuild or another --out")
    if meta.stemmer != STEMMER:
        # Built before token_stem existed (or by another stemmer): its rows cannot take
        # new ones, and searches by word form need the column, so it is built again.
        if progress:
            progress(f"{out} was built without {STEMMER} word stems: rebuilding it")
        return None
    if meta.doc_fields is None:
        # Likewise for rows without their documents' fields (source, metadata columns).
        if progress:
            progress(f"{out} was built without document fields: rebuilding it")
        return None
    return meta


def build_index(dataset: str, mix: str | Mix, out: str, kind: str = "auto",
                rebuild: bool = False, search: SearchParams | None = None,
                storage_options: dict | None = None,
                progress: Callable[[str], None] | None = None) -> BuildSummary:
    """Create or extend the index at ``out`` with the dataset's committed shard files."""
    # LanceDB logs k-means "empty cluster" warnings to stderr unless told otherwise.
    os.environ.setdefault("LANCEDB_LOG", "error")
    import lancedb

    if kind not in INDEX_KINDS:
        raise ElmoUserError(f"--index must be one of {', '.join(INDEX_KINDS)}")
    ds = open_dataset(dataset, storage_options)
    if ds.descriptor.n_output_layers < 1:
        raise ElmoUserError(f"{dataset} stores no layers to index")
    the_mix = ds.mix(mix)
    db = lancedb.connect(out, storage_options=lance_options(storage_options))
    exists = TABLE in db.list_tables().tables
    meta = None if rebuild or not exists else reusable_meta(ds, the_mix, out, storage_options,
                                                            progress)
    document_files = dict(ds.shard_files("documents"))
    documents: dict[str, tuple[list[str], list[dict[str, Any]]]] = {}
    if meta is None:
        # Which metadata fields become columns is settled when the index is created.
        documents = {key: read_documents(ds, path) for key, path in document_files.items()}
        if exists:
            db.drop_table(TABLE)
            exists = False
        meta = IndexMeta(dataset=str(dataset), model_fingerprint=ds.descriptor.model_fingerprint,
                         mix=the_mix.to_json(), mix_name=the_mix.name, dim=ds.descriptor.dim,
                         kind=kind, stemmer=STEMMER,
                         doc_fields=indexable_fields(field_kinds(
                             row for _, rows in documents.values() for row in rows)))
    meta.kind = kind
    if search is not None:
        meta.search, meta.search_auto = search, False
    summary = BuildSummary(out=out)
    files = ds.shard_files("tokens")
    sentence_files = dict(ds.shard_files("sentences"))
    keys_now = {key for key, _ in files}
    table = db.open_table(TABLE) if exists else None
    # Rows of shard files that are no longer committed (a part deleted, or a shard
    # re-embedded under a new run id) leave the index; this keeps it equal to the
    # dataset's committed view without a rebuild.
    for key in [k for k in meta.indexed if k not in keys_now]:
        if table is not None:
            table.delete(shard_filter(key))
        meta.indexed.remove(key)
        summary.removed_files += 1
    indexed = set(meta.indexed)
    for key, path in files:
        if key in indexed:
            summary.skipped_files += 1
            continue
        if table is not None:
            # A run killed after an add but before its metadata write leaves rows that no
            # metadata lists: drop them, so that a row is never held twice.
            table.delete(shard_filter(key))
        n_rows = 0
        t0 = time.perf_counter()
        for rows in rows_for_file(ds, the_mix, path, key, sentence_files.get(key),
                                   documents_of(ds, key, document_files, documents),
                                   meta.doc_fields or {}):
            t1 = time.perf_counter()
            summary.seconds_read += t1 - t0
            if table is None:
                table = db.create_table(TABLE, data=rows)
            else:
                table.add(rows)
            n_rows += rows.num_rows
            t0 = time.perf_counter()
            summary.seconds_add += t0 - t1
        summary.added_files += 1
        summary.added_rows += n_rows
        meta.indexed.append(key)
        if progress:
            progress(f"{key}: {n_rows} rows")
    if table is None:
        raise ElmoUserError(f"{dataset} has no committed token rows to index")
    return finish_index(table, meta, summary, out, storage_options)


def finish_index(table: Any, meta: IndexMeta, summary: BuildSummary, out: str,
                 storage_options: dict | None = None) -> BuildSummary:
    """After rows were added or deleted: scalar and vector indexes, word counts, search
    parameters and the metadata (``meta.indexed`` already says what the table holds)."""
    t0 = time.perf_counter()
    meta.rows = table.count_rows()
    want_hnsw = meta.kind == "hnsw" or (meta.kind == "auto" and meta.rows >= HNSW_MIN_ROWS)
    has_scalar = {tuple(ix.columns) for ix in table.list_indices()}
    for column in SCALAR_COLUMNS:
        if (column,) not in has_scalar:
            from lancedb.index import BTree

            # BTree, not Bitmap: a corpus vocabulary has far too many values for bitmaps.
            table.create_index(column, config=BTree())
    if summary.added_rows or summary.removed_files:
        # Compacts the new fragments and folds them into the existing indexes (vector and
        # scalar) instead of retraining them.
        table.optimize()
    grown = meta.trained_rows and meta.rows > 4 * meta.trained_rows
    if want_hnsw and (not _has_vector_index(table) or grown):
        # First index, or the data outgrew the partitions it was trained with: (re)train.
        if grown:
            meta.num_partitions = None
        _create_vector_index(table, meta)
    meta.built = "hnsw" if _has_vector_index(table) else "flat"
    if meta.search_auto:
        meta.search = SearchParams.for_rows(meta.rows)
    if summary.added_rows or summary.removed_files or meta.counted_rows != meta.rows:
        _write_word_counts(table, meta.rows, out, storage_options)
        meta.counted_rows = meta.rows
    summary.seconds_index = time.perf_counter() - t0
    summary.rows, summary.built = meta.rows, meta.built
    _write_meta(out, meta, storage_options)
    return summary


def _write_word_counts(table: Any, rows: int, out: str, storage_options: dict | None) -> None:
    import io

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from pipeline.store import write_bytes_atomic

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
    write_bytes_atomic(fs, f"{root}/{WORD_COUNTS}", body.getvalue())


# --------------------------------------------------------------------------- searching
