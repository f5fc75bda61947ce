"""How a committed shard file becomes index rows: its tokens mixed on read, stored as the
index's vector dtype, joined to their sentences' starts and their documents' fields, kept
only for the selected words (``index_words``); and the index's two LanceDB tables (token
rows, sentence rows) that take them. ``index_build`` (``elmo index build``) and the jobs'
refresh both add files through ``IndexTables.add_file``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.doc_fields import index_field_arrays, quote, read_documents
from pipeline.lookup.index.meta import TABLE, VECTOR_DTYPE, IndexMeta
from pipeline.lookup.index.sentences import SENTENCES_TABLE, join_in_row_order, sentence_rows
from pipeline.lookup.index.words import keep_mask, stem_words
from pipeline.lookup.layers.mixes import iter_mixed
from pipeline.lookup.layers.tokens import check_layers
from schemas.dataset import Dataset
from schemas.layers import cast_floats
from schemas.mix_specs import Mix

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
    ivf: dict | None = None  # IndexMeta.ivf when this build made the in-memory IVF
    ray_nodes: int = 0  # Ray nodes whose tasks did the per-shard work (ray_work)

    def line(self) -> str:
        total = self.seconds_read + self.seconds_add + self.seconds_index
        held = "" if self.ivf is None or "held_rows_nprobe" not in self.ivf else \
            f" at {self.ivf['held_rows_nprobe']} lists"
        ivf = "" if self.ivf is None else (
            f"; in-memory IVF: {self.ivf['nprobe']} of {self.ivf['lists']} lists probed, "
            f"recall@10 {self.ivf['recall_at_10']:.3f}{held} on "
            f"{self.ivf['calibration_queries']} stored rows")
        if self.ivf is not None and self.ivf["recall_at_10"] < RECALL_PROMISED:
            ivf += (f". That is below {RECALL_PROMISED}: more probes found no more of the "
                    "exact neighbours; searches that must find them all pass exact=True "
                    "(`elmo senses search --exact`), which ranks every row")
        return (f"index {self.out}: +{self.added_rows} rows from {self.added_files} shard "
                f"files ({self.skipped_files} already in, {self.removed_files} removed), "
                f"{self.rows} rows, vector index {self.built}; {total:.1f} s (mix+read "
                f"{self.seconds_read:.1f}, add {self.seconds_add:.1f}, index "
                f"{self.seconds_index:.1f}){ivf}")


def _sentence_lookup(ds: Dataset, path: str | None) -> pa.Table:
    """The sentences of one shard file (the live view names it; None: no sentence rows)."""
    import pyarrow.parquet as pq

    from schemas import SENTENCE_SCHEMA

    columns = ["doc_id", "sent_idx", "text", "char_start"]
    if path is None:
        return SENTENCE_SCHEMA.empty_table().select(columns)
    with ds.fs.open(path, "rb") as handle:
        return pq.read_table(handle, columns=columns, page_checksum_verification=True)


def split_key(key: str) -> tuple[str, int]:
    """``(part, shard)`` of a committed file's key ``part/shard=k/run_id``."""
    part, shard, _ = key.split("/")
    return part, int(shard.split("=", 1)[1])


def shard_filter(key: str) -> str:
    part, shard = split_key(key)
    return f"part = {quote(part)} AND shard = {shard}"


# What a search's recall@10 is promised to reach; a build that measures less says so.
RECALL_PROMISED = 0.95
ADD_BYTES = 256 << 20  # float32 vectors per LanceDB add: bounds memory for any shard size


def rows_for_file(ds: Dataset, mix: Mix, path: str, key: str, sentences: pa.Table,
                  documents: tuple[list[str], list[dict[str, Any]]],
                  doc_fields: dict[str, str] | None, vector_dtype: str = VECTOR_DTYPE,
                  selected: pa.Array | None = None,
                  on_read: Callable[[int], Any] | None = None,
                  compact: bool = False) -> Iterator[pa.Table]:
    """Index rows of one committed tokens file, in chunks (vectors mixed on read and
    stored as ``vector_dtype``), with their documents' fields (``documents``: its
    documents file, ``read_documents``); ``sentences``: its sentences file's ``doc_id,
    sent_idx, text, char_start``; ``selected``: the lowercase words kept (None: all);
    ``on_read``: told the tokens read, kept or not (progress); ``compact``: each row's
    ``row`` in the file instead of its vector (``index_vectors``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    dim = ds.descriptor.dim
    part, shard = split_key(key)
    starts = sentences.select(["doc_id", "sent_idx", "char_start"]).rename_columns(
        ["doc_id", "sent_idx", "sent_start"])
    cols = ("doc_id", "sent_idx", "tok_idx", "token", "char_start", "char_end")
    chunk_rows = max(4096, ADD_BYTES // (4 * dim))
    # A compact index reads no vectors here (they are read again when its IVF is made).
    batches = ((batch, None) for batch in _token_batches(ds, path, cols, chunk_rows,
                                                         mix.used_layers)) \
        if compact else iter_mixed(ds, mix, columns=cols, files=[path], batch_rows=chunk_rows)
    first_row = 0
    for batch, vec in batches:
        if on_read is not None:
            on_read(batch.num_rows)
        meta = pa.Table.from_batches([batch])
        file_row = np.arange(first_row, first_row + batch.num_rows, dtype=np.int32)
        first_row += batch.num_rows
        lower = pc.utf8_lower(meta["token"]).combine_chunks()
        keep = keep_mask(lower, selected)
        if keep is not None:
            mask = keep.to_numpy(False)
            meta, lower, file_row = meta.filter(keep), lower.filter(keep), file_row[mask]
            vec = None if vec is None else vec[mask]
        n = meta.num_rows
        if n == 0:
            continue
        # in step with the vectors
        joined = join_in_row_order(meta, starts, ["doc_id", "sent_idx"])
        if joined.num_rows != n:
            raise ElmoUserError(f"{path}: tokens and sentences disagree (duplicate sentences)")
        sent_start = pc.fill_null(joined["sent_start"], 0)
        vocabulary = pc.unique(lower)  # stem each word type once, not each token
        stems = pa.array(stem_words(vocabulary.to_pylist()), pa.string())
        if vec is None:
            vector_or_row = {"row": pa.array(file_row)}
        else:
            values = cast_floats(vec, vector_dtype).reshape(-1)
            vector_or_row = {"vector": pa.FixedSizeListArray.from_arrays(pa.array(values), dim)}
        yield pa.table({
            **vector_or_row,
            "token": joined["token"],
            "token_lower": lower,
            "token_stem": stems.take(pc.index_in(lower, value_set=vocabulary)),
            "doc_id": joined["doc_id"],
            "sent_idx": joined["sent_idx"],
            "tok_idx": joined["tok_idx"],
            "part": pa.array([part] * n, pa.string()),
            "shard": pa.array(np.full(n, shard, np.int32)),
            "start": pc.subtract(joined["char_start"], sent_start).cast(pa.int32()),
            "end": pc.subtract(joined["char_end"], sent_start).cast(pa.int32()),
            # None: fields joined by doc_id where needed, not stored (a compact index).
            **({} if doc_fields is None else index_field_arrays(
                joined["doc_id"].combine_chunks(), documents, doc_fields)),
        })


def _token_batches(ds: Dataset, path: str, columns: Sequence[str], batch_rows: int,
                   layers: Sequence[int]) -> Iterator[pa.RecordBatch]:
    """``columns`` of one tokens file, in file order (page checksums checked), once the
    file is known to hold ``layers``, which a compact index will read from it."""
    import pyarrow.parquet as pq

    with ds.fs.open(path, "rb") as handle:
        source = pq.ParquetFile(handle, page_checksum_verification=True)
        check_layers(source.schema_arrow, [f"layer_{k}" for k in layers], path)
        yield from source.iter_batches(batch_size=batch_rows, columns=list(columns))


class IndexTables:
    """The index's two LanceDB tables, token rows and sentence rows, each created with
    its first rows; ``overwrite``: by a new version that replaces what they hold (the
    versions before stay readable: ``publish``)."""

    def __init__(self, db: Any, overwrite: bool = False) -> None:
        names = () if overwrite else db.list_tables().tables
        self.db = db
        self.tokens = db.open_table(TABLE) if TABLE in names else None
        self.sentences = db.open_table(SENTENCES_TABLE) if SENTENCES_TABLE in names else None

    def versions(self) -> dict[str, int]:
        """Table name -> its version now (what a build commits)."""
        return {name: table.version for name, table in ((TABLE, self.tokens),
                                                         (SENTENCES_TABLE, self.sentences))
                if table is not None}

    def delete(self, where: str) -> None:
        for table in (self.tokens, self.sentences):
            if table is not None:
                table.delete(where)

    def _add(self, name: str, rows: pa.Table) -> Any:
        table = getattr(self, name)
        if table is None:
            table = self.db.create_table(name, data=rows, mode="overwrite")
            setattr(self, name, table)
        else:
            table.add(rows)
        return table

    def add_file(self, ds: Dataset, mix: Mix, path: str, key: str, sentences_path: str | None,
                 documents: tuple[list[str], list[dict[str, Any]]], meta: IndexMeta,
                 selected: pa.Array | None, summary: BuildSummary,
                 on_read: Callable[[int], Any] | None = None) -> int:
        """Add the rows of one shard file (its token rows, then the sentences they use);
        ``on_read``: told the tokens read (progress)."""
        import pyarrow as pa

        sentences = _sentence_lookup(ds, sentences_path)
        keys = []
        n_rows = 0
        t0 = time.perf_counter()
        for rows in rows_for_file(ds, mix, path, key, sentences, documents,
                                  meta.stored_fields(), meta.vector_dtype, selected,
                                  on_read, meta.compact):
            t1 = time.perf_counter()
            summary.seconds_read += t1 - t0
            self._add(TABLE, rows)
            keys.append(rows.select(["doc_id", "sent_idx"]))
            n_rows += rows.num_rows
            t0 = time.perf_counter()
            summary.seconds_add += t0 - t1
        if keys:
            part, shard = split_key(key)
            self._add(SENTENCES_TABLE, sentence_rows(sentences, pa.concat_tables(keys),
                                                     part, shard))
        summary.added_files += 1
        summary.added_rows += n_rows
        summary.seconds_add += time.perf_counter() - t0
        return n_rows


def file_rows(ds: Dataset, paths: list[str]) -> int:
    """Token rows of the tokens files ``paths`` (from their Parquet footers)."""
    import pyarrow.parquet as pq

    total = 0
    for path in paths:
        with ds.fs.open(path, "rb") as handle:
            total += pq.ParquetFile(handle).metadata.num_rows
    return total


def documents_of(ds: Dataset, key: str, files: dict[str, str],
                  read: dict[str, tuple[list[str], list[dict[str, Any]]]]
                  ) -> tuple[list[str], list[dict[str, Any]]]:
    """The documents of shard file ``key`` (already ``read``, else read now)."""
    if key not in read:
        read[key] = read_documents(ds, files[key]) if key in files else ([], [])
    return read[key]
