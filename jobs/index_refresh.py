"""Refresh the LanceDB index of each mix in a job spec after a run, incrementally.

After a run, each mix's index is brought to the dataset's live view by a delta
(``refresh_index``): the rows of the documents of parts that left the view are deleted,
the token files of parts that joined it are mixed and added (LanceDB ``delete`` /
``add``), then ``optimize`` folds the new rows into the existing indexes; never a full
rebuild, except for an index that does not exist yet.

Crash safety: ``_jobs/index/<mix>.json`` records the parts the index reflects. The delta
of a refresh is computed from that record and the live view (not from the run that just
happened), so a refresh that failed or was killed is completed by the next run, and a
part that an index still reflects is not deleted from the dataset until the index has
dropped its rows (its ``documents`` table names the doc ids to delete).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

from elmo_model.errors import ElmoUserError
from jobs.spec import JobSpec
from jobs.state import jobs_root
from pipeline.lookup.index.build import build_index, execute_build
from pipeline.lookup.index.build_plan import BuildPlan, BuildSettings, PublishedIndex
from pipeline.lookup.index.meta import lance_options, stale_rows
from pipeline.lookup.index.publish import one_build_at_a_time
from pipeline.lookup.index.rows import BuildSummary
from pipeline.lookup.index.shard_work import ShardRunner
from schemas.dataset import (
    Dataset,
    ShardFile,
    list_files,
    open_dataset,
    read_json,
    write_bytes_atomic,
)

INDEX_STATE_DIR = "index"


def _state_path(root: str, mix: str) -> str:
    return f"{jobs_root(root)}/{INDEX_STATE_DIR}/{mix.replace(':', '_')}.json"


def read_index_state(fs: Any, root: str, mix: str) -> dict | None:
    return read_json(fs, _state_path(root, mix))


def referenced_parts(fs: Any, root: str, mixes: tuple[str, ...]) -> set[str]:
    """Parts some index still reflects: the dataset must keep them for now."""
    parts: set[str] = set()
    for mix in mixes:
        state = read_index_state(fs, root, mix)
        if state:
            parts.update(state.get("parts", []))
    return parts


def _doc_ids(fs: Any, root: str, parts: Sequence[str]) -> list[str]:
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for file in list_files(fs, root, "documents", parts):
        with fs.open(file.path, "rb") as handle:
            ids.update(pq.read_table(handle, columns=["doc_id"]).column("doc_id").to_pylist())
    return sorted(ids)


def refresh_indexes(spec: JobSpec, fs: Any, root: str, live: set[str]) -> dict[str, str]:
    """Bring every mix's index to the live view; mix -> a one-line result."""
    results: dict[str, str] = {}
    for mix in spec.mixes:
        state = read_index_state(fs, root, mix)
        indexed = set(state.get("parts", [])) if state else set()
        if state is not None and indexed == live:
            results[mix] = "up to date"
            continue
        added = sorted(live - indexed)
        add_files = [f.path for f in list_files(fs, root, "tokens", added)]
        remove_ids = _doc_ids(fs, root, sorted(indexed - live))
        try:
            summary = refresh_index(spec.output, mix=mix, index_uri=spec.index_uri(mix),
                          add_files=add_files, remove_doc_ids=remove_ids,
                          storage_options=spec.storage_options or None,
                          compact=spec.index_compact, ray_address=spec.ray_address)
        except Exception as error:  # one mix failing must not hide the others' results
            results[mix] = f"failed: {type(error).__name__}: {error}"[:500]
            continue
        record = {"mix": mix, "index_uri": spec.index_uri(mix), "parts": sorted(live),
                  "updated_at": time.time()}
        write_bytes_atomic(fs, _state_path(root, mix),
                           json.dumps(record, indent=1, sort_keys=True).encode())
        on_ray = f"; shard work on {summary.ray_nodes} Ray node(s)" if summary.ray_nodes else ""
        results[mix] = (f"refreshed: +{len(add_files)} files, -{len(remove_ids)} documents "
                        f"({spec.index_uri(mix)}){on_ray}")
    return results


def _named_files(ds: Dataset, live: Sequence[ShardFile], names: Sequence[str]
                 ) -> list[ShardFile]:
    """The files of ``live`` that ``names`` (paths of the dataset's file system, or URIs)
    name, in the order given."""
    by_name: dict[str, ShardFile] = {}
    for file in live:
        by_name[file.path] = by_name[ds.uri_of(file.path)] = file
    missing = [name for name in names if name not in by_name]
    if missing:
        raise ElmoUserError(f"{missing[0]} is not a live token file of {ds.uri}; refresh "
                            "with the files its live view lists")
    return [by_name[name] for name in dict.fromkeys(names)]


@one_build_at_a_time("index_uri")
def refresh_index(dataset: str, *, mix: str, index_uri: str, add_files: Sequence[str] = (),
                  remove_doc_ids: Sequence[str] = (), storage_options: dict | None = None,
                  compact: bool | None = None, ray_address: str | None = None
                  ) -> BuildSummary:
    """Apply a delta to the sense index at ``index_uri``: delete the rows of
    ``remove_doc_ids``, add the rows of the token files ``add_files`` (live files of the
    dataset, as paths or URIs) and nothing else, then update the indexes and metadata.

    An index that does not exist yet, was built without word stems or document fields
    or in an older layout, or holds another mix or is not of the kind ``compact`` asks
    (True, False; None: either) goes to ``build_index`` (which builds it in full, or says
    to rebuild). The index keeps the words it was created with.

    ``ray_address`` (a job's ``[ray] address``): a compact index's per-shard work (the new
    files' vectors, the shards' codes) runs as Ray tasks on that cluster
    (``ray_work.ShardTasks``), giving the index a local refresh gives."""
    from pipeline.lookup.ray_work import ShardTasks  # imports no Ray until it runs work

    tasks = ShardTasks(ray_address) if ray_address else None
    try:
        summary = _refresh_index(dataset, mix, index_uri, add_files, remove_doc_ids,
                                 storage_options, compact, tasks)
    finally:
        if tasks is not None:
            tasks.close()
    if tasks is not None:
        summary.ray_nodes = len(tasks.nodes)
    return summary


def _refresh_index(dataset: str, mix: str, index_uri: str, add_files: Sequence[str],
                   remove_doc_ids: Sequence[str], storage_options: dict | None,
                   compact: bool | None, tasks: ShardRunner | None) -> BuildSummary:
    os.environ.setdefault("LANCEDB_LOG", "error")  # as build_index: no k-means warnings
    import lancedb

    settings = BuildSettings(dataset, mix, index_uri, storage_options=storage_options,
                             compact=compact)
    ds = open_dataset(dataset, storage_options)
    db = lancedb.connect(index_uri, storage_options=lance_options(storage_options))
    plan = plan_refresh(settings, ds, PublishedIndex.read(index_uri, storage_options, db),
                        add_files, remove_doc_ids)
    if plan is None:
        return build_index(dataset, mix, index_uri, storage_options=storage_options,
                           compact=compact, shard_runner=tasks)
    return execute_build(plan, settings, ds, db, shard_runner=tasks)


def plan_refresh(settings: BuildSettings, ds: Dataset, published: PublishedIndex,
                 add_files: Sequence[str], remove_doc_ids: Sequence[str]) -> BuildPlan | None:
    """The plan of a refresh: the rows of ``remove_doc_ids`` and of the files no longer
    live deleted, the token files ``add_files`` (live files of the dataset, as paths or
    URIs) added whole, nothing else; the words the index was created with are kept, never
    re-resolved (index_words). None where ``build_index`` builds it instead: no index,
    one of an older generation (``stale_rows``), of another mix or kind, or that cannot
    be read back (a refresh stopped half way is discarded by the build either way)."""
    meta, the_mix = published.meta, ds.mix(settings.mix)
    if (meta is None or not published.has_table or published.damage is not None
            or stale_rows(meta) is not None or not meta.the_mix().same_vectors(the_mix)
            or (settings.compact is not None and meta.compact != settings.compact)):
        return None
    live = ds.shard_files("tokens")
    live_keys = {f.key for f in live}
    return BuildPlan(out=settings.out, mix=the_mix, compact=meta.compact, kind=meta.kind,
                     extends=meta, why_new=None, words=meta.selection(),
                     # whatever the doc ids miss of a file gone
                     delete=tuple(k for k in meta.indexed if k not in live_keys),
                     add=tuple((f.key, f.path) for f in _named_files(ds, live, add_files)),
                     kept=0, delete_docs=tuple(sorted(set(remove_doc_ids))))
