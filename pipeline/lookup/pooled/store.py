"""Pooled vectors as derived tables of a dataset: ``elmo pool`` writes them, search and
the API read them.

    pool_dataset("runs/example", mix="average", by="sentence", method="unit_mean")

One file per (mix, method, tokens shard) under ``derived/sentence_vectors/`` or
``derived/document_vectors/``, listed in ``_derived.json`` (``schemas.derived_tables``)
under the key ``<mix>/<method>/<part>/shard=<k>/<run_id>``. Pooling reads each tokens
file once, mixing its layers as it reads them (``iter_mixed``) and keeping only per-group
statistics (``pooling.GroupStats``), so memory follows one file's groups, not the corpus.
A later run pools only the tokens shards with no file yet for that mix and method (a grown
dataset: its new documents); a shard that is no longer live (re-embedded, or dropped by a
job) has its file replaced by an empty one, so that readers without our code, who read
every file the registry lists, see the live rows only. Each file is written whole and
swapped into the registry (``replace_rows``): a reader sees a shard's old rows or its new.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError
from pipeline.lookup.layers.mixes import iter_mixed
from pipeline.lookup.pooled.pooling import (
    DEFAULT_METHOD,
    DEFAULT_MIX,
    GroupStats,
    check_by,
    check_method,
    run_starts,
)
from schemas.dataset import Dataset, open_dataset
from schemas.derived_tables import DERIVED_SCHEMAS, derived_entries, replace_rows
from schemas.mix_specs import Mix

if TYPE_CHECKING:
    import pyarrow as pa

TABLES = {"sentence": "sentence_vectors", "document": "document_vectors"}
# Rows mixed per batch: the unit_mean pass holds a copy of a batch.
BATCH_ROWS = 8192


@dataclass
class PoolSummary:
    table: str
    mix: str
    method: str
    pooled_shards: int  # tokens shards pooled by this run
    kept_shards: int  # already pooled before
    emptied_shards: int  # no longer live: their rows dropped
    rows: int  # rows written by this run
    tokens: int  # tokens read by this run

    def line(self) -> str:
        return (f"{self.table} ({self.mix}, {self.method}): pooled {self.pooled_shards} "
                f"shard(s), {self.tokens} tokens -> {self.rows} rows; "
                f"{self.kept_shards} already pooled"
                + (f"; {self.emptied_shards} no longer live, emptied"
                   if self.emptied_shards else ""))


def named_mix(ds: Dataset, mix: str) -> Mix:
    """A mix by name (built-in or stored): a pooled table records the name it was made with."""
    if not isinstance(mix, str) or mix.lstrip().startswith("{"):
        raise ElmoUserError("pool a named mix (top, average, layer:<k>, or one stored with "
                            "`elmo mix fit`), not an inline one")
    return ds.mix(mix)


def entry_prefix(mix: Mix, method: str) -> str:
    return f"{mix.name}/{method}/"


def pool_dataset(dataset: str | Dataset, mix: str = DEFAULT_MIX, by: str = "sentence",
                 method: str = DEFAULT_METHOD, *, rebuild: bool = False, progress: bool = False,
                 say: Callable[[str], None] | None = None,
                 storage_options: dict | None = None) -> PoolSummary:
    """Pool ``dataset``'s token vectors of ``mix`` per ``by`` (sentence or document) with
    ``method`` into its derived table (``TABLES[by]``): the live tokens shards not pooled
    yet, or all of them with ``rebuild``. ``progress``: a tqdm bar of tokens on stderr."""
    from tqdm import tqdm

    check_by(by)
    check_method(method)
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset, storage_options)
    the_mix = named_mix(ds, mix)
    table = TABLES[by]
    prefix = entry_prefix(the_mix, method)
    entries = {key[len(prefix):]: entry
               for key, entry in derived_entries(ds.fs, ds.root, table).items()
               if key.startswith(prefix)}
    live = ds.shard_files("tokens")
    if not live:
        raise ElmoUserError(f"{ds.uri} has no committed tokens to pool")
    todo = [f for f in live if rebuild or f.key not in entries]
    stale = sorted(set(entries) - {f.key for f in live})
    model = ds.descriptor.model_fingerprint
    summary = PoolSummary(table, the_mix.name, method, len(todo), len(live) - len(todo), 0,
                          0, 0)
    for key in stale:
        if entries[key].get("rows"):
            replace_rows(ds.fs, ds.root, table, prefix + key,
                         DERIVED_SCHEMAS[table]().empty_table())
            summary.emptied_shards += 1
    total = _token_rows(ds, [f.path for f in todo])
    with tqdm(total=total, unit="tok", unit_scale=True, desc=f"pool: {table}",
              disable=not progress, dynamic_ncols=True) as bar:
        for shard in todo:
            rows = pool_file(ds, the_mix, by, method, shard.path, bar.update)
            rows = _with_columns(rows, the_mix.name, method, model, shard.key)
            replace_rows(ds.fs, ds.root, table, prefix + shard.key, rows)
            summary.rows += rows.num_rows
            summary.tokens += int(np.sum(rows.column("n_tokens").to_numpy())) \
                if rows.num_rows else 0
            if say and not progress:
                say(f"{shard.key}: {rows.num_rows} rows")
    return summary


def _token_rows(ds: Dataset, paths: list[str]) -> int:
    import pyarrow.parquet as pq

    fs = ds.arrow_filesystem()
    total = 0
    for path in paths:
        with fs.open_input_file(path) as source:
            total += pq.read_metadata(source).num_rows
    return total


def pool_file(ds: Dataset, mix: Mix, by: str, method: str, path: str,
              advance: Callable[[int], Any] = lambda n: None) -> pa.Table:
    """One tokens file's groups pooled: ``doc_id`` (``sent_idx``), ``n_tokens``,
    ``vector``."""
    import pyarrow as pa

    columns = ["doc_id", "sent_idx"] if by == "sentence" else ["doc_id"]
    stats = GroupStats(method, ds.descriptor.dim)
    for meta, vectors in iter_mixed(ds, mix, columns, files=[path], batch_rows=BATCH_ROWS):
        keys = [meta.column(c).to_numpy(zero_copy_only=False) for c in columns]
        starts = run_starts(*keys)
        stats.add(vectors, starts, list(zip(*(k[starts] for k in keys), strict=True)))
        advance(len(vectors))
    groups, counts, pooled = stats.merged()
    width = pooled.shape[1] if pooled.ndim == 2 else ds.descriptor.dim
    out: dict[str, Any] = {"doc_id": pa.array([g[0] for g in groups], pa.string())}
    if by == "sentence":
        out["sent_idx"] = pa.array([int(g[1]) for g in groups], pa.int32())
    out["n_tokens"] = pa.array(counts, pa.int32())
    offsets = pa.array(np.arange(len(groups) + 1, dtype=np.int32) * width, pa.int32())
    out["vector"] = pa.ListArray.from_arrays(offsets, pa.array(pooled.reshape(-1),
                                                                pa.float32()))
    return pa.table(out)


def _with_columns(rows: pa.Table, mix: str, method: str, model: str, shard: str
                  ) -> pa.Table:
    import pyarrow as pa

    n = rows.num_rows
    for name, value in (("mix", mix), ("method", method), ("model", model),
                        ("tokens_shard", shard)):
        rows = rows.append_column(name, pa.array([value] * n, pa.string()))
    return rows.select([f.name for f in DERIVED_SCHEMAS[
        "sentence_vectors" if "sent_idx" in rows.column_names else "document_vectors"]()])


# --------------------------------------------------------------------------- reading


@dataclass
class PooledVectors:
    """One pooled table's live rows for one mix and method, held for search: keys, token
    counts and unit-length vectors (float32)."""

    by: str
    mix: str
    method: str
    doc_ids: np.ndarray  # object array of str
    sent_idx: np.ndarray | None  # int32, sentences only
    shards: np.ndarray  # object array: each row's tokens shard key
    unit: np.ndarray  # [n, width] float32, rows of unit length

    def __len__(self) -> int:
        return len(self.doc_ids)


def pooled_files(ds: Dataset, table: str, prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """``(tokens shard key, registry entry)`` of the table's files for one mix and method
    whose shard is live."""
    live = {f.key for f in ds.shard_files("tokens")}
    return [(key[len(prefix):], entry)
            for key, entry in sorted(derived_entries(ds.fs, ds.root, table).items())
            if key.startswith(prefix) and key[len(prefix):] in live]


def read_pooled_table(ds: Dataset, by: str, mix: str, method: str) -> pa.Table:
    """The live rows of one pooled table for ``mix`` and ``method`` (every column). Each
    file is checked against the sha256 its registry entry records before it is used (the
    files are small: a row per sentence), so a damaged file is an error, never wrong hits."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_by(by)
    check_method(method)
    table = TABLES[by]
    the_mix = named_mix(ds, mix)
    files = pooled_files(ds, table, entry_prefix(the_mix, method))
    if not files:
        raise ElmoUserError(f"{ds.uri} has no {table} for mix {the_mix.name!r} and method "
                            f"{method!r}; run `elmo pool {ds.uri} --mix {the_mix.name} --by "
                            f"{by} --method {method}`")
    parts = []
    for _, entry in files:
        with ds.fs.open(f"{ds.root}/{entry['path']}", "rb") as handle:
            data = handle.read()
        if entry.get("sha256") and hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ElmoUserError(
                f"{ds.uri}/{entry['path']} is damaged (its sha256 differs from "
                f"_derived.json's); run `elmo pool {ds.uri} --mix {the_mix.name} --by {by} "
                f"--method {method} --rebuild`")
        parts.append(pq.read_table(pa.BufferReader(data)))
    return pa.concat_tables(parts).cast(DERIVED_SCHEMAS[table]())


def load_pooled(ds: Dataset, by: str, mix: str, method: str) -> PooledVectors:
    """``read_pooled_table`` as arrays for search (vectors scaled to unit length)."""
    rows = read_pooled_table(ds, by, mix, method)
    vectors = list_matrix(rows.column("vector"))
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.maximum(norms, 1e-12)
    return PooledVectors(
        by, named_mix(ds, mix).name, method,
        rows.column("doc_id").to_numpy(zero_copy_only=False),
        rows.column("sent_idx").to_numpy() if by == "sentence" else None,
        rows.column("tokens_shard").to_numpy(zero_copy_only=False),
        np.ascontiguousarray(unit, np.float32))


def list_matrix(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """``[n, width]`` float32 from a list column whose rows all have one width."""
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(array)
    values = array.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    if n == 0:
        return np.zeros((0, 0), np.float32)
    if len(values) % n:
        raise ElmoUserError("pooled vectors of different widths in one table")
    return values.reshape(n, len(values) // n)
