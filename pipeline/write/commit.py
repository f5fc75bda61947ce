"""Stage 4, on the driver: check a worker's commit record and make its item visible.

The driver is the only process that commits, one item at a time, under the dataset
lock (pipeline/write/output.py). Committing item ``k`` of part ``p``:

1. check the record: its files lie under this run's staging prefix and have the sizes
   the worker reported (a torn or foreign file is refused, the item runs again);
2. delete whatever a crashed run left at the item's final names (moved there, but never
   recorded), then move each staged file to ``<table>/shard=<k>/<p>.parquet``;
3. write ``_manifest/<p>/shard=<k>.json`` (temp name + move): the commit point.

An item is committed if and only if its manifest entry exists. A second record for a
committed item (a duplicate or retried attempt) is ignored; its staging is deleted with
the run's staging, so it never becomes visible.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import time
from typing import Any

from pipeline.write.output import STAGING_DIR
from pipeline.write.plan import WorkItem
from pipeline.write.work_item import CommitRecord
from schemas import TABLES
from schemas.files import write_bytes_atomic
from schemas.manifest import manifest_path, table_file


class BadCommitRecordError(RuntimeError):
    """A record whose files are missing or differ from what the worker reported."""


def check_record(fs: Any, root: str, run_id: str, item: WorkItem, record: CommitRecord) -> None:
    if record.item != item.index:
        raise BadCommitRecordError(f"record for item {record.item} returned for item {item.index}")
    prefix = f"{STAGING_DIR}/{run_id}/"
    for table, rel in record.files.items():
        if table not in TABLES or not rel.startswith(prefix) or ".." in rel.split("/"):
            raise BadCommitRecordError(f"item {item.index}: unexpected staged file {rel!r}")
        if record.counts.get(table, 0) <= 0:
            raise BadCommitRecordError(f"item {item.index}: a {table} file without rows")
        size = fs.size(f"{root}/{rel}")
        if size != record.sizes.get(table):
            raise BadCommitRecordError(f"item {item.index}: {rel} has {size} bytes, the worker "
                                  f"reported {record.sizes.get(table)}")
    for table, rows in record.counts.items():
        if rows and table not in record.files:
            raise BadCommitRecordError(f"item {item.index}: {rows} {table} rows but no file")


def commit_item(fs: Any, root: str, part: str, run_id: str, item: WorkItem,
                record: CommitRecord, info: dict | None = None) -> dict:
    """Move the item's staged files into place and write its manifest entry."""
    check_record(fs, root, run_id, item, record)
    files = {}
    for table in TABLES:
        final = table_file(root, table, item.index, part)
        if fs.exists(final):  # left by a run that died before its manifest entry
            fs.rm(final)
        rel = record.files.get(table)
        if rel is None:
            continue
        fs.makedirs(posixpath.dirname(final), exist_ok=True)
        fs.mv(f"{root}/{rel}", final)
        files[table] = posixpath.relpath(final, root)
    entry = {"shard": item.index, "part": part, "run_id": run_id, "attempt": record.attempt,
             "committed_at": time.time(), "counts": record.counts, "files": files,
             "bytes": {t: record.sizes[t] for t in files},
             "sha256": {t: record.sha256[t] for t in files},
             "item": item.describe(), "model_tokens": record.model_tokens,
             "worker": record.worker, **({"info": info} if info else {})}
    write_bytes_atomic(fs, manifest_path(root, part, item.index),
                       json.dumps(entry, indent=1, sort_keys=True).encode())
    return entry


def discard_attempt(fs: Any, root: str, record: CommitRecord) -> None:
    """Delete the staged files of an attempt that will not be committed (a duplicate)."""
    for rel in record.files.values():
        with contextlib.suppress(FileNotFoundError):
            fs.rm(f"{root}/{rel}")
