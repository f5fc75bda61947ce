"""Derived tables: data computed from a dataset and kept inside it, beside the tables the
embedding run wrote: ``senses``, each use's sense (``elmo senses label``), and
``sentence_vectors`` / ``document_vectors``, pooled vectors (``elmo pool``; one file per
mix, method and tokens shard, keyed ``<mix>/<method>/<part>/shard=<k>/<run_id>``).

    OUT/_derived.json                                  the registry (one atomic file)
    OUT/derived/senses/<word>-<id>.parquet             one file per labelled word

``_derived.json`` lists every live file with its row count, size and sha256, keyed by
what it holds (the word)::

    {"format": "elmo-store/derived", "version": 1, "generation": 3,
     "tables": {"senses": {"union": {"path": "derived/senses/union-1a2b3c4d.parquet",
                                     "rows": 812, "bytes": 40211, "sha256": "…"}}}}

A reader reads the registry once and reads exactly the files it lists (the live view of
derived tables: ``Dataset.paths("senses")``, the DuckDB views, ``elmo dataset verify``).
Replacing a word's rows writes the new file under a new name first, then swaps the
registry (temp name and move: readers see the old rows or the new, never both or part),
then deletes the old file. One writer at a time: a second labelling run started while
another rewrites the registry can lose the other's entry (rerun it).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import posixpath
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from elmo_model.errors import ElmoUserError

if TYPE_CHECKING:
    import pyarrow as pa

DERIVED_FILE = "_derived.json"
DERIVED_DIR = "derived"
DERIVED_FORMAT = "elmo-store/derived"
DERIVED_VERSION = 1


def senses_schema() -> pa.Schema:
    """One row per labelled use: where the token is (the dataset's key), the word it was
    labelled as, its sense (1 = the largest), the sense's label, its cosine distance to the
    sense's centre, and the model and mix its vector came from."""
    import pyarrow as pa

    return pa.schema([
        ("word", pa.string()), ("doc_id", pa.string()), ("sent_idx", pa.int32()),
        ("tok_idx", pa.int32()), ("token", pa.string()), ("sense", pa.int32()),
        ("label", pa.string()), ("distance", pa.float32()), ("model", pa.string()),
        ("mix", pa.string())])


def sentence_vectors_schema() -> pa.Schema:
    """One row per pooled sentence (``elmo pool --by sentence``): its key, the mix and
    pooling method, the model (fingerprint), its token count, the tokens shard it was
    pooled from (``part/shard=k/run_id``) and the pooled vector (float32, a list: its
    width is the dataset's, twice that for ``mean_max``)."""
    import pyarrow as pa

    return pa.schema([
        ("doc_id", pa.string()), ("sent_idx", pa.int32()), *_pooled_fields(pa)])


def document_vectors_schema() -> pa.Schema:
    """One row per pooled document (``elmo pool --by document``): as
    ``sentence_vectors_schema`` without ``sent_idx``."""
    import pyarrow as pa

    return pa.schema([("doc_id", pa.string()), *_pooled_fields(pa)])


def _pooled_fields(pa: Any) -> list[tuple[str, Any]]:
    return [("mix", pa.string()), ("method", pa.string()), ("model", pa.string()),
            ("n_tokens", pa.int32()), ("tokens_shard", pa.string()),
            ("vector", pa.list_(pa.float32()))]


DERIVED_SCHEMAS = {"senses": senses_schema, "sentence_vectors": sentence_vectors_schema,
                   "document_vectors": document_vectors_schema}


def read_registry(fs: Any, root: str) -> dict[str, Any]:
    """``_derived.json`` (an empty registry when none was written)."""
    try:
        with fs.open(f"{root}/{DERIVED_FILE}", "rb") as handle:
            data = json.loads(handle.read())
    except FileNotFoundError:
        return {"format": DERIVED_FORMAT, "version": DERIVED_VERSION, "generation": 0,
                "tables": {}}
    if data.get("format") != DERIVED_FORMAT or data.get("version") != DERIVED_VERSION:
        raise ElmoUserError(f"{root}/{DERIVED_FILE}: format {data.get('format')!r} version "
                            f"{data.get('version')!r} is not {DERIVED_FORMAT} "
                            f"{DERIVED_VERSION}; written by another elmo-store release")
    return data


def derived_entries(fs: Any, root: str, table: str) -> dict[str, dict[str, Any]]:
    """Key (the word) -> ``{"path", "rows", "bytes", "sha256"}`` of the table's live files."""
    return dict(read_registry(fs, root).get("tables", {}).get(table, {}))


def derived_paths(fs: Any, root: str, table: str) -> list[tuple[str, str]]:
    """``(key, path under root)`` of the table's live files, by key."""
    return [(f"{table}/{key}", f"{root}/{entry['path']}")
            for key, entry in sorted(derived_entries(fs, root, table).items())]


def replace_rows(fs: Any, root: str, table: str, key: str, rows: pa.Table) -> dict[str, Any]:
    """Make ``rows`` the table's rows for ``key`` (all of them, replacing any before):
    new file, registry swapped, old file deleted. Returns the new entry."""
    import pyarrow.parquet as pq

    from schemas.files import write_bytes_atomic

    if table not in DERIVED_SCHEMAS:
        raise ValueError(f"no derived table {table!r}")
    rows = rows.cast(DERIVED_SCHEMAS[table]())
    buffer = io.BytesIO()
    pq.write_table(rows, buffer, compression="zstd", write_page_checksum=True)
    data = buffer.getvalue()
    slug = quote(key, safe="")[:80]
    rel = posixpath.join(DERIVED_DIR, table, f"{slug}-{uuid.uuid4().hex[:12]}.parquet")
    write_bytes_atomic(fs, f"{root}/{rel}", data)
    entry = {"path": rel, "rows": rows.num_rows, "bytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest(), "written_at": time.time()}
    registry = read_registry(fs, root)
    old = registry.setdefault("tables", {}).setdefault(table, {}).get(key)
    registry["tables"][table][key] = entry
    registry["generation"] = int(registry.get("generation", 0)) + 1
    write_bytes_atomic(fs, f"{root}/{DERIVED_FILE}",
                       (json.dumps(registry, indent=1, sort_keys=True) + "\n").encode())
    if old and old.get("path") != rel:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(f"{root}/{old['path']}")
    return entry


def expected_derived(fs: Any, root: str) -> list[tuple[str, str, dict[str, Any]]]:
    """``(table, key, entry)`` of every derived file the registry lists, for
    ``elmo dataset verify``."""
    tables = read_registry(fs, root).get("tables", {})
    return [(table, key, entry) for table, entries in sorted(tables.items())
            for key, entry in sorted(entries.items())]
