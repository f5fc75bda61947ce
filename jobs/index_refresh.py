"""Refresh the LanceDB index of each mix in a job spec after a run, incrementally.

INTEGRATION POINT with the lookup layer (issue 4, ``pipeline/index.py``). The job calls

    pipeline.index.refresh_index(dataset_uri, *, mix, index_uri, add_files,
                                 remove_doc_ids, storage_options)

which must (1) create the index from ``add_files`` when ``index_uri`` holds none, else
(2) delete the rows whose ``doc_id`` is in ``remove_doc_ids``, then (3) add the mixed
token rows of the Parquet files ``add_files`` (tokens table files of the dataset) and
(4) ``optimize()``, without a full rebuild. The lookup layer has no such function yet,
so :func:`_refresh_with_build_index` provides it over its ``build_index`` (which adds new
committed files incrementally) plus a LanceDB ``delete``. Without the lookup layer each
mix reports "skipped" and nothing is recorded, so the first run after it lands builds the
index from the whole live view.

Crash safety: ``_jobs/index/<mix>.json`` records the parts the index reflects. The delta
of a refresh is computed from that record and the live view (not from the run that just
happened), so a refresh that failed or was killed is completed by the next run, and a
part that an index still reflects is not deleted from the dataset until the index has
dropped its rows (its ``documents`` table names the doc ids to delete).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from jobs.spec import JobSpec
from jobs.state import jobs_root

INDEX_STATE_DIR = "index"
LOOKUP_MODULE = "pipeline.index"
LOOKUP_FUNCTION = "refresh_index"


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


def lookup_refresh_function() -> Callable[..., Any] | None:
    """The lookup layer's incremental refresh: its ``refresh_index`` once it has one, else
    an adapter over its ``build_index``; None while neither exists."""
    import importlib

    try:
        module = importlib.import_module(LOOKUP_MODULE)
    except ImportError:
        return None
    refresh = getattr(module, LOOKUP_FUNCTION, None)
    if refresh is not None:
        return refresh
    if getattr(module, "build_index", None) is not None:
        return _refresh_with_build_index
    return None


def _refresh_with_build_index(dataset: str, *, mix: str, index_uri: str,
                              add_files: list[str], remove_doc_ids: list[str],
                              storage_options: dict | None) -> None:
    """``refresh_index`` on top of ``pipeline.index.build_index``.

    ``build_index`` adds every committed tokens file it has not indexed yet (LanceDB
    ``add`` + ``optimize``) but never deletes rows; so the rows of removed documents are
    deleted here first (before the add: a changed file's new rows carry the same doc ids).
    ``build_index`` reads the dataset's live view (``_live.json``), which the runner has
    just published, so ``add_files`` is implied, and the shard files of replaced parts
    leave the index there too.
    """
    import lancedb

    from elmo_model.errors import ElmoUserError
    from pipeline import index as lookup

    if remove_doc_ids and lookup.read_meta(index_uri, storage_options) is not None:
        options = {k: str(v) for k, v in storage_options.items()} if storage_options else None
        # build_index writes its meta after creating the table: meta present, table present.
        table = lancedb.connect(index_uri, storage_options=options).open_table(lookup.TABLE)
        for start in range(0, len(remove_doc_ids), 500):  # bounded filter size
            chunk = remove_doc_ids[start:start + 500]
            table.delete(f"doc_id IN ({', '.join(lookup.quote(i) for i in chunk)})")
    try:
        lookup.build_index(dataset, mix, index_uri, storage_options=storage_options)
    except ElmoUserError as error:
        # A part name comes back when a file returns to an earlier content; build_index
        # then sees a "re-embedded" shard it once held. Rare: rebuild from the live parts.
        if "re-embedded" not in str(error):
            raise
        lookup.build_index(dataset, mix, index_uri, rebuild=True,
                           storage_options=storage_options)


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
    refresh = lookup_refresh_function()
    for mix in spec.mixes:
        if refresh is None:
            results[mix] = (f"skipped: {LOOKUP_MODULE}.{LOOKUP_FUNCTION} is not available yet "
                            "(lookup layer); the index will be built from the live view "
                            "once it is")
            continue
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
            refresh(spec.output, mix=mix, index_uri=spec.index_uri(mix), add_files=add_files,
                    remove_doc_ids=remove_ids, storage_options=spec.storage_options or None)
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
