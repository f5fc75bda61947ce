"""A LanceDB index of mixed token vectors, for contextual-sense search.

    elmo index build data/ds --mix top --out data/ds-top.lance

One row per stored token: ``vector`` (the mix, float32), ``token``, ``token_lower``,
``token_stem`` (the Snowball English stem of ``token_lower``: plays, played and playing
are all ``play``), ``doc_id``, ``sent_idx``, ``tok_idx``, ``part``, ``shard``,
``sentence`` (its text) and ``start``/``end`` (the token's character span inside
``sentence``, for highlighting), then its document's ``source`` and metadata fields as
``meta_<name>`` columns (``doc_fields``: the fields whose values were all numbers or all
text when the index was created), so that searches filter on them before the vector
search. Scalar BTree indexes on ``token``, ``token_lower`` and ``token_stem`` make
``token_stem = ...`` prefilters (a word and its forms) cheap.

Vector index (``--index``): ``flat`` (none: exact brute-force search), ``hnsw``
(IVF_HNSW_SQ, cosine) or ``auto`` (hnsw from ``HNSW_MIN_ROWS`` rows on, else flat).
IVF_PQ was rejected: recall@10 0.08-0.5 at defaults here, and 9x slower to build on
float16. A prefiltered query whose filter leaves at most ``EXACT_FILTER_VALUES`` floats
(2,000 rows of 256-d, 500 of 1024-d) runs exact over just those rows (recall 1.0 at a
few ms); above that, LanceDB's exact scan of the filtered rows grows to ~40 ms (2,000
rows of 1024-d) and beyond, so the prefiltered graph search is used (recall@10 0.98-0.99
measured).

``<out>/_elmo_index.json`` records the dataset, its model fingerprint, the mix (weights
in full, so the index remembers what it holds even if the dataset's mix is later
changed), the search parameters and which committed shard files are in it. Building
again brings the index to the dataset's committed view incrementally: rows of shard files
no longer committed (a deleted part, a re-embedded shard) are deleted, shard files
committed since are added (LanceDB ``delete`` / ``add``), then ``optimize`` folds the new
rows into the existing vector and scalar indexes. Only a changed mix needs ``--rebuild``.
Each build also rewrites ``<out>/_word_counts.parquet`` (rows per lowercase token, with
its stem), which routes filtered queries without a count query; the search parameters
follow the index size (``SearchParams.for_rows``) unless given. An index written before
stems or document fields were stored is rebuilt by the next build (its rows lack the
columns).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.dataset import Dataset, open_dataset, open_fs
from pipeline.lookup.doc_fields import (
    INDEX_FIELDS,
    DocumentTable,
    FieldFilter,
    field_column,
    field_kinds,
    index_field_arrays,
    indexable_fields,
    quote,
    read_documents,
)
from pipeline.lookup.mix_specs import Mix
from pipeline.lookup.mixes import iter_mixed
from pipeline.lookup.vector_search import VectorSearch

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

INDEX_META = "_elmo_index.json"
# token_lower -> rows, so that routing a filtered query (exact or graph) costs no query.
WORD_COUNTS = "_word_counts.parquet"
INDEX_FORMAT = "elmo-store/sense-index"
TABLE = "tokens"
HNSW_MIN_ROWS = 50_000
# A prefilter leaving at most this many floats (rows x dim) is answered by an exact scan
# of those rows: 2,000 rows at 256-d, 500 at 1024-d. At 1M x 1024 an exact scan of 500-2,000
# rows took 42 ms (p50) against 14 ms for the prefiltered graph, which still found 0.98.
EXACT_FILTER_VALUES = 512_000
# A filter on a field the index lacks becomes "doc_id IN (...)" of at most this many ids.
MAX_JOIN_IDS = 100_000
# From this many rows on, fewer partitions are probed (see SearchParams.for_rows).
LARGE_INDEX_ROWS = 300_000
INDEX_KINDS = ("auto", "hnsw", "flat")
RESULT_COLUMNS = ["token", "doc_id", "sent_idx", "tok_idx", "sentence", "start", "end", "part",
                  "shard"]
# Fills token_stem. Recorded in the index: matching a word's forms at query time needs the
# stems the build stored, so an index without them (or with another stemmer's) is rebuilt.
STEMMER = "snowball-english"
SCALAR_COLUMNS = ("token", "token_lower", "token_stem")


@functools.cache
def _stemmer() -> Any:
    import snowballstemmer

    return snowballstemmer.stemmer("english")


# The stemmer is pure Python (~50 us a word): a build meets the same words in every
# chunk, so each is stemmed once (the sample's 102k tokens, 9.3k words: 0.5-0.7 s cold,
# 11-15 ms with every word seen).
@functools.lru_cache(maxsize=1 << 18)
def _stem(word: str) -> str:
    return _stemmer().stemWord(word)


def stem_words(words: Sequence[str]) -> list[str]:
    """Snowball English stems of ``words``, lowercased first (Plays, played -> play)."""
    return [_stem(w.lower()) for w in words]


@dataclass
class SearchParams:
    """Query-time knobs of the HNSW index (measured in bench/lookup.py)."""

    nprobes: int = 20
    # ef 150 vs 100: recall@10 0.959 -> 0.971 at 100k x 1024, 0.947 -> 0.955 at 1M x 256.
    ef: int = 150
    # Re-rank 5k candidates with the full vectors: SQ's error alone cost 3-4 points of
    # recall@10 (0.93 -> 0.96 at 100k, 0.94 -> 0.99 at 1M) for ~2 ms.
    refine_factor: int | None = 5

    @classmethod
    def for_rows(cls, rows: int) -> SearchParams:
        """The defaults for an index of ``rows`` vectors.

        A query costs ~5 ms plus ~0.4 ms per probed partition here, whatever the
        partition size, while the share of partitions a query must probe for recall@10
        >= 0.95 falls as they multiply (0.3 sqrt(n) of them): 20 of ~100 at 100k rows
        (0.970, p50 13 ms at 1024-d), 10 of 300 at 1M (0.972 / 15 ms at 1024-d, 0.955 /
        14 ms at 256-d; 20 probes there cost 18-27 ms for +0.01)."""
        return cls(nprobes=10) if rows >= LARGE_INDEX_ROWS else cls()


@dataclass
class IndexMeta:
    dataset: str
    model_fingerprint: str
    mix: dict[str, Any]
    mix_name: str
    dim: int
    kind: str = "auto"
    built: str = "flat"  # what exists now: flat or hnsw
    num_partitions: int | None = None
    trained_rows: int = 0  # rows when the vector index was last trained
    m: int = 20
    ef_construction: int = 300
    search: SearchParams = field(default_factory=SearchParams)
    search_auto: bool = True  # search follows the index size (False: set by the user)
    indexed: list[str] = field(default_factory=list)  # part/shard=k/run_id keys
    rows: int = 0
    counted_rows: int = 0  # rows when WORD_COUNTS was written (0: not written)
    stemmer: str = ""  # what filled token_stem ("": built before stems were stored)
    # Metadata fields stored as meta_<name> columns, name -> int/float/string (None: built
    # before document fields were stored, so rows lack even ``source``).
    doc_fields: dict[str, str] | None = None
    format: str = INDEX_FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> IndexMeta:
        data = json.loads(text)
        if data.get("format") != INDEX_FORMAT:
            raise ElmoUserError("not an elmo-store sense index")
        data["search"] = SearchParams(**data.get("search", {}))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def the_mix(self) -> Mix:
        return Mix.from_json(self.mix_name, self.mix)


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


def read_meta(out: str, storage_options: dict | None = None) -> IndexMeta | None:
    fs, root = open_fs(out, storage_options)
    try:
        with fs.open(f"{root}/{INDEX_META}", "rb") as handle:
            return IndexMeta.from_json(handle.read().decode())
    except FileNotFoundError:
        return None


def _write_meta(out: str, meta: IndexMeta, storage_options: dict | None = None) -> None:
    from pipeline.store import write_bytes_atomic

    fs, root = open_fs(out, storage_options)
    write_bytes_atomic(fs, f"{root}/{INDEX_META}", meta.to_json().encode())


def _lance_options(storage_options: dict | None) -> dict[str, str] | None:
    return {k: str(v) for k, v in storage_options.items()} if storage_options else None


def column_words(words: Sequence[str], column: str) -> Sequence[str]:
    """``words`` as ``column`` stores them: ``token_lower`` lowercases the words,
    ``token_stem`` stems them, ``token`` takes them as they are."""
    if column == "token_lower":
        return [w.lower() for w in words]
    if column == "token_stem":
        return stem_words(words)
    return words


def token_filter(words: Sequence[str], column: str = "token_lower") -> str:
    """``column = 'w'`` / ``column IN (...)``, the words as ``column`` stores them
    (``column_words``)."""
    words = column_words(words, column)
    if len(words) == 1:
        return f"{column} = {quote(words[0])}"
    return f"{column} IN ({', '.join(quote(w) for w in words)})"


# --------------------------------------------------------------------------- building


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


def _shard_filter(key: str) -> str:
    part, shard = _split_key(key)
    return f"part = {quote(part)} AND shard = {shard}"


ADD_BYTES = 256 << 20  # float32 vectors per LanceDB add: bounds memory for any shard size


def _rows_for_file(ds: Dataset, mix: Mix, path: str, key: str, sentences_path: str | None,
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


def _documents_of(ds: Dataset, key: str, files: dict[str, str],
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
    db = lancedb.connect(out, storage_options=_lance_options(storage_options))
    meta = None if rebuild else read_meta(out, storage_options)
    exists = TABLE in db.list_tables().tables
    if meta is not None:
        if meta.model_fingerprint != ds.descriptor.model_fingerprint:
            raise ElmoUserError(f"{out} indexes a dataset of another model; use --rebuild "
                                "or another --out")
        if not meta.the_mix().same_vectors(the_mix):
            raise ElmoUserError(f"{out} holds mix {meta.mix_name!r} "
                                f"({meta.the_mix().describe()}); asked for "
                                f"{the_mix.describe()}: use --rebuild or another --out")
        if not exists:
            meta = None
    if meta is not None and meta.stemmer != STEMMER:
        # Built before token_stem existed (or by another stemmer): its rows cannot take
        # new ones, and searches by word form need the column, so it is built again.
        if progress:
            progress(f"{out} was built without {STEMMER} word stems: rebuilding it")
        meta = None
    if meta is not None and meta.doc_fields is None:
        # Likewise for rows without their documents' fields (source, metadata columns).
        if progress:
            progress(f"{out} was built without document fields: rebuilding it")
        meta = None
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
            table.delete(_shard_filter(key))
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
            table.delete(_shard_filter(key))
        n_rows = 0
        t0 = time.perf_counter()
        for rows in _rows_for_file(ds, the_mix, path, key, sentence_files.get(key),
                                   _documents_of(ds, key, document_files, documents),
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


class SenseIndex:
    """An opened index: its metadata and LanceDB table."""

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        import lancedb

        meta = read_meta(uri, storage_options)
        if meta is None:
            raise ElmoUserError(f"{uri} is not an elmo sense index (no {INDEX_META}); "
                                "build one with `elmo index build`")
        self.uri, self.meta = uri, meta
        self.storage_options = storage_options
        self.table = lancedb.connect(uri, storage_options=_lance_options(storage_options)
                                     ).open_table(TABLE)
        self._counts: pa.Table | None = None
        self._counts_read = False
        self._documents: DocumentTable | None = None

    @property
    def has_stems(self) -> bool:
        return self.meta.stemmer == STEMMER

    def require_stems(self) -> None:
        if not self.has_stems:
            raise ElmoUserError(
                f"{self.uri} was built before word forms were indexed; rebuild it with "
                f"`elmo index build {self.meta.dataset} --mix {self.meta.mix_name} --out "
                f"{self.uri} --rebuild`, or search the exact word (--same-form)")

    def _word_counts(self) -> pa.Table | None:
        """The counts file the build writes (None: this index predates it or is stale)."""
        if not self._counts_read:
            self._counts_read = True
            if self.meta.counted_rows == self.meta.rows > 0:
                import pyarrow.parquet as pq

                fs, root = open_fs(self.uri, self.storage_options)
                try:
                    with fs.open(f"{root}/{WORD_COUNTS}", "rb") as handle:
                        self._counts = pq.read_table(handle)
                except FileNotFoundError:
                    self._counts = None
        return self._counts

    def word_rows(self, words: Sequence[str], column: str = "token_lower") -> int:
        """Rows that ``token_filter(words, column)`` keeps: ``token_lower`` (the words in
        any case) or ``token_stem`` (the words and their forms). From the counts file the
        build writes; a count query on the table for an index built before it existed."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if column not in ("token_lower", "token_stem"):
            raise ValueError(f"word_rows counts token_lower or token_stem, not {column!r}")
        counts = self._word_counts()
        if counts is None or column not in counts.column_names:
            return self.table.count_rows(token_filter(words, column))
        wanted = pa.array(column_words(words, column), pa.string())
        hits = pc.is_in(counts.column(column), value_set=wanted)
        return int(pc.sum(counts.column("rows").filter(hits)).as_py() or 0)

    @property
    def mix(self) -> Mix:
        return self.meta.the_mix()

    def documents(self) -> DocumentTable:
        """The dataset's documents and their fields (read on first use, then kept)."""
        if self._documents is None:
            try:
                self._documents = DocumentTable(open_dataset(self.meta.dataset,
                                                             self.storage_options))
            except (ElmoUserError, OSError) as error:
                # Clusters need only the index: without its dataset they show no fields.
                self._documents = DocumentTable(None, f"the index's dataset is not readable "
                                                      f"({error})")
        return self._documents

    def indexed_fields(self) -> dict[str, str]:
        """Document fields this index's rows hold (name -> kind), filtered by LanceDB."""
        if self.meta.doc_fields is None:  # built before document fields were stored
            return {"doc_id": "string"}
        return {**dict.fromkeys(INDEX_FIELDS, "string"), **self.meta.doc_fields}

    def fields_where(self, filters: Sequence[FieldFilter]) -> str | None:
        """A Lance predicate for document-field ``filters``: on the index's own columns
        where it has the field, else ``doc_id IN`` the documents that pass."""
        indexed = self.indexed_fields()
        clauses, joined = [], []
        for condition in filters:
            kind = indexed.get(condition.field) or self.documents().check(condition.field)
            typed = condition.typed(kind)
            # "contains" reads a number as its digits: that comparison runs on the join.
            if condition.field in indexed and (condition.op != "~" or kind == "string"):
                clauses.append(typed.lance(field_column(condition.field)))
            else:
                joined.append(typed)
        if joined:
            ids = self.documents().doc_ids_where(joined)
            if len(ids) > MAX_JOIN_IDS:
                raise ElmoUserError(
                    f"{len(ids)} documents pass {' '.join(f.describe() for f in joined)}, too "
                    f"many to filter on a join; rebuild the index (`elmo index build "
                    f"{self.meta.dataset} --out {self.uri} --rebuild`) so that it holds "
                    "these fields, or narrow the filter")
            clauses.append(f"doc_id IN ({', '.join(quote(i) for i in ids)})" if ids
                           else "false")
        return " AND ".join(f"({c})" for c in clauses) if clauses else None

    def search(self, vector: np.ndarray, k: int = 10, words: Sequence[str] | None = None,
               exact: bool = False, columns: Sequence[str] = RESULT_COLUMNS,
               forms: bool = False, where: str | None = None) -> pa.Table:
        """Nearest tokens by cosine; ``words``: only tokens whose lowercase form is one of
        them, or with ``forms`` any form of them (same stem: plays, played, playing);
        ``where``: a further Lance predicate (``fields_where``), also a prefilter.
        Returns the columns plus ``_distance`` (cosine distance), nearest first."""
        import numpy as np

        vector = np.asarray(vector, np.float32).reshape(1, -1)
        return self.vector_query(vector, k, words, exact, columns, forms, where).to_arrow()

    def vector_query(self, vectors: np.ndarray, k: int = 10,
                     words: Sequence[str] | None = None, exact: bool = False,
                     columns: Sequence[str] = RESULT_COLUMNS, forms: bool = False,
                     where: str | None = None) -> VectorSearch:
        """The search ``search`` runs, for ``[n, dim]`` query vectors (``to_arrow`` runs
        it): with more than one, LanceDB answers them in one call and adds a
        ``query_index`` column."""
        import numpy as np

        if forms and words:
            self.require_stems()
        column = "token_stem" if forms else "token_lower"
        if k < 1:
            raise ElmoUserError("-k must be at least 1")
        vectors = np.asarray(vectors, np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.meta.dim:
            raise ElmoUserError(f"query vector has {vectors.shape[-1]} values, index has "
                                f"{self.meta.dim}")
        word_where = token_filter(words, column) if words else None
        if where is not None:
            # Rows the whole filter leaves (a count query: the word counts do not know it).
            where = f"({word_where}) AND ({where})" if word_where else where
            small = self.table.count_rows(where) * self.meta.dim <= EXACT_FILTER_VALUES
        else:
            where = word_where
            small = where is not None and self.word_rows(words, column) * self.meta.dim \
                <= EXACT_FILTER_VALUES
        graph = not (exact or self.meta.built != "hnsw" or small)
        return VectorSearch(self.table, vectors, k, tuple(columns), where,
                            self.meta.search if graph else None)

    def occurrences(self, words: Sequence[str], columns: Sequence[str] = RESULT_COLUMNS,
                    limit: int = 100_000, where: str | None = None) -> pa.Table:
        """Every row whose lowercase token is one of ``words`` (with vectors), and that
        passes ``where`` (a Lance predicate, ``fields_where``) if given."""
        where = token_filter(words) if where is None else f"({token_filter(words)}) AND ({where})"
        return (self.table.search().where(where).select([*columns, "vector"])
                .limit(limit).to_arrow())
