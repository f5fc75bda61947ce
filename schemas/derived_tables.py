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
then deletes the old file.

Any number of writers at once (``elmo senses label`` runs, any code calling
``replace_rows``): each update holds the registry's lock ``_derived.lock`` (a
``DatasetLock``: taken over when its owner died) from writing its file to deleting the
old one, so updates are serialized and none is lost. A file in a table's folder that the
registry does not list was left by a writer killed mid-update: the next update of that
table deletes it (``elmo dataset verify`` reports it meanwhile), and any temporary copy
of the registry itself.
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
DERIVED_LOCK = "_derived.lock"
# How long an update waits for the others' (each holds the lock for a file write).
DERIVED_LOCK_WAIT_S = 300.0
# The command that writes a derived table's rows for one key again (what mends a damaged
# or missing file); {key} is the key, {part0}, {part1}: its first '/'-separated parts (a
# pooled table's key is ``<mix>/<method>/...``). A table not named here: "rewrite it".
DERIVED_FIXES = {
    "senses": "elmo senses label {key} --index INDEX",
    "sentence_vectors": "elmo pool DATASET --by sentence --mix {part0} --method {part1} --rebuild",
    "document_vectors": "elmo pool DATASET --by document --mix {part0} --method {part1} --rebuild",
}


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
    new file, registry swapped, old file deleted, all under the registry's lock (safe
    with any number of writers at once). Returns the new entry."""
    import pyarrow.parquet as pq

    from schemas.files import write_bytes_atomic
    from schemas.lock import DatasetLock

    if table not in DERIVED_SCHEMAS:
        raise ValueError(f"no derived table {table!r}")
    rows = rows.cast(DERIVED_SCHEMAS[table]())
    buffer = io.BytesIO()
    pq.write_table(rows, buffer, compression="zstd", write_page_checksum=True)
    data = buffer.getvalue()
    slug = quote(key, safe="")[:80]
    rel = posixpath.join(DERIVED_DIR, table, f"{slug}-{uuid.uuid4().hex[:12]}.parquet")
    entry = {"path": rel, "rows": rows.num_rows, "bytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest(), "written_at": time.time()}
    with DatasetLock(fs, root, name=DERIVED_LOCK, wait_s=DERIVED_LOCK_WAIT_S):
        # The file is written under the lock too: every file in the table's folder that
        # the registry does not list is then a dead writer's, never one about to be listed.
        write_bytes_atomic(fs, f"{root}/{rel}", data)
        registry = read_registry(fs, root)
        old = registry.setdefault("tables", {}).setdefault(table, {}).get(key)
        registry["tables"][table][key] = entry
        registry["generation"] = int(registry.get("generation", 0)) + 1
        write_bytes_atomic(fs, f"{root}/{DERIVED_FILE}",
                           (json.dumps(registry, indent=1, sort_keys=True) + "\n").encode())
        if old and old.get("path") != rel:
            with contextlib.suppress(FileNotFoundError):
                fs.rm(f"{root}/{old['path']}")
        for path in unlisted_files(fs, root, registry, [table]):
            with contextlib.suppress(FileNotFoundError):
                fs.rm(f"{root}/{path}")
        # A registry's temporary copy, of a writer killed before its move (write_whole's).
        for path in fs.glob(f"{root}/{DERIVED_FILE}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                fs.rm(path)
    return entry


def unlisted_files(fs: Any, root: str, registry: dict[str, Any] | None = None,
                   tables: list[str] | None = None) -> list[str]:
    """Files (paths under root) in the derived tables' folders that the registry does not
    list: left by a writer killed between writing its file and listing it."""
    registry = registry if registry is not None else read_registry(fs, root)
    out = []
    for table in tables if tables is not None else sorted(DERIVED_SCHEMAS):
        listed = {e["path"] for e in registry.get("tables", {}).get(table, {}).values()}
        try:
            found = fs.find(f"{root}/{DERIVED_DIR}/{table}")
        except (FileNotFoundError, OSError):
            continue
        prefix = fs._strip_protocol(root).rstrip("/") + "/"
        for name in sorted(found):
            rel = fs._strip_protocol(name)[len(prefix):]
            if rel not in listed:
                out.append(rel)
    return out


def derived_fix(table: str, key: str) -> str:
    """The command that writes ``key``'s rows of ``table`` again."""
    command = DERIVED_FIXES.get(table)
    if command is None:
        return f"rewrite {table} of {key!r}"
    parts = [*key.split("/"), "", ""]
    return f"`{command.format(key=key, part0=parts[0], part1=parts[1])}`"


def expected_derived(fs: Any, root: str) -> list[tuple[str, str, dict[str, Any]]]:
    """``(table, key, entry)`` of every derived file the registry lists, for
    ``elmo dataset verify``."""
    tables = read_registry(fs, root).get("tables", {})
    return [(table, key, entry) for table, entries in sorted(tables.items())
            for key, entry in sorted(entries.items())]
