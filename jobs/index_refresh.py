"""Refresh the LanceDB index of each mix in a job spec after a run, incrementally.

After a run, each mix's index is brought to the dataset's live view with the lookup
layer's incremental ``pipeline.lookup.index.refresh_index`` (delete the rows of removed
documents, add the new parts' token files, ``optimize``), never a full rebuild.

Crash safety: ``_jobs/index/<mix>.json`` records the parts the index reflects. The delta
of a refresh is computed from that record and the live view (not from the run that just
happened), so a refresh that failed or was killed is completed by the next run, and a
part that an index still reflects is not deleted from the dataset until the index has
dropped its rows (its ``documents`` table names the doc ids to delete).
"""

from __future__ import annotations

import json
import time
from typing import Any

from jobs.spec import JobSpec
from jobs.state import jobs_root

INDEX_STATE_DIR = "index"


def _state_path(root: str, mix: str) -> str:
    return f"{jobs_root(root)}/{INDEX_STATE_DIR}/{mix.replace(':', '_')}.json"


def read_index_state(fs: Any, root: str, mix: str) -> dict | None:
    from pipeline.store import read_json

    return read_json(fs, _state_path(root, mix))


def referenced_parts(fs: Any, root: str, mixes: tuple[str, ...]) -> set[str]:
    """Parts some index still reflects: the dataset must keep them for now."""
    parts: set[str] = set()
    for mix in mixes:
        state = read_index_state(fs, root, mix)
        if state:
            parts.update(state.get("parts", []))
    return parts


def _part_files(fs: Any, root: str, table: str, part: str) -> list[str]:
    from pipeline.store import part_files

    return [fs.unstrip_protocol(path) for path in part_files(fs, root, part, table)]


def _doc_ids(fs: Any, root: str, part: str) -> list[str]:
    import pyarrow.parquet as pq

    ids: list[str] = []
    for uri in _part_files(fs, root, "documents", part):
        with fs.open(fs._strip_protocol(uri), "rb") as handle:
            ids += pq.read_table(handle, columns=["doc_id"]).column("doc_id").to_pylist()
    return ids


def refresh_indexes(spec: JobSpec, fs: Any, root: str, live: set[str]) -> dict[str, str]:
    """Bring every mix's index to the live view; mix -> a one-line result."""
    from pipeline.store import write_bytes_atomic

    results: dict[str, str] = {}
    if not spec.mixes:
        return results
    from pipeline.lookup.index import refresh_index

    for mix in spec.mixes:
        state = read_index_state(fs, root, mix)
        indexed = set(state.get("parts", [])) if state else set()
        if state is not None and indexed == live:
            results[mix] = "up to date"
            continue
        added = sorted(live - indexed)
        removed = sorted(indexed - live)
        add_files = [f for part in added for f in _part_files(fs, root, "tokens", part)]
        remove_ids = sorted({i for part in removed for i in _doc_ids(fs, root, part)})
        try:
            refresh_index(spec.output, mix=mix, index_uri=spec.index_uri(mix),
                          add_files=add_files, remove_doc_ids=remove_ids,
                          storage_options=spec.storage_options or None)
        except Exception as error:  # one mix failing must not hide the others' results
            results[mix] = f"failed: {type(error).__name__}: {error}"[:500]
            continue
        record = {"mix": mix, "index_uri": spec.index_uri(mix), "parts": sorted(live),
                  "updated_at": time.time()}
        write_bytes_atomic(fs, _state_path(root, mix),
                           json.dumps(record, indent=1, sort_keys=True).encode())
        results[mix] = (f"refreshed: +{len(add_files)} files, -{len(remove_ids)} documents "
                        f"({spec.index_uri(mix)})")
    return results
