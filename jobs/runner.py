"""``elmo jobs run``: one incremental run of a job (see jobs/state.py for the layout).

A run, holding the job lock:

1. lists the sources and compares each file with its recorded fingerprint: size and
   mtime/etag first; when those differ, the content hash (files up to
   ``hash_max_bytes``) decides, so a touched-but-unchanged file is not re-embedded;
2. embeds each new or changed file into its own part through the pipeline (the file is
   planned into work items like any input; their exactly-once commits make this step
   resumable after a kill -9: a part's name depends only on the file's URI and content,
   so the next run finds the committed items and finishes the rest);
3. switches ``state.json`` to the new set of parts in one atomic write (the job's commit
   point), then publishes the same parts as the dataset's ``_live.json`` (the readers'
   commit point, ``pipeline.write.output.publish_live``): before it every reader sees the
   previous run's data, after it the new data. A run killed between the two writes is
   caught up by the next run, which republishes ``_live.json`` from ``state.json`` first;
4. deletes parts outside the live view, refreshes the mixes' indexes, and records the run.

With nothing new, changed or (when ``delete_missing``) deleted, no model is loaded.
"""

from __future__ import annotations

import contextlib
import posixpath
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from jobs.index_refresh import referenced_parts, refresh_indexes
from jobs.spec import JobSpec
from jobs.state import (
    PART_PREFIX,
    FileRecord,
    JobState,
    RunRecord,
    content_digest,
    iter_runs,
    job_lock,
    mark_crashed_runs,
    part_name,
    read_state,
    write_run,
    write_state,
)
from pipeline.write.config import EmbedConfig
from pipeline.write.embed import EmbedSummary, embed_corpus
from pipeline.write.inputs import list_sources
from pipeline.write.output import PlanMismatchError
from pipeline.write.ray_setup import ray_session
from pipeline.write.work_item import reuse_models
from schemas import PARTITION_COLUMN, TABLES
from schemas.files import open_fs
from schemas.lock import DatasetLock
from schemas.manifest import (
    MANIFEST_DIR,
    committed_items,
    iter_parts,
    publish_live,
    read_live,
    sum_counts,
)

Clock = Callable[[], float]


@dataclass
class RunPlan:
    new: list[Any] = field(default_factory=list)  # pipeline.write.inputs.SourceFile
    changed: list[Any] = field(default_factory=list)
    touched: list[Any] = field(default_factory=list)  # mtime/etag moved, same content
    deleted: list[str] = field(default_factory=list)  # URIs
    unchanged: int = 0
    digests: dict[str, str | None] = field(default_factory=dict)  # by URI

    def counts(self, delete_missing: bool) -> dict[str, int]:
        return {"new": len(self.new), "changed": len(self.changed),
                "deleted": len(self.deleted) if delete_missing else 0,
                "missing_kept": 0 if delete_missing else len(self.deleted),
                "touched": len(self.touched), "unchanged": self.unchanged}

    def has_work(self, delete_missing: bool) -> bool:
        return bool(self.new or self.changed or (delete_missing and self.deleted))


def plan_run(fs_for: Callable[[str], Any], sources: list[Any], state: JobState,
             hash_max_bytes: int) -> RunPlan:
    plan = RunPlan()
    seen = set()
    for source in sources:
        seen.add(source.uri)
        old = state.files.get(source.uri)
        if old is not None and old.size == source.size and old.version == source.version:
            plan.unchanged += 1
            continue
        digest = content_digest(fs_for(source.uri), source.path, source.size, source.version,
                                hash_max_bytes)
        plan.digests[source.uri] = digest
        if old is None:
            plan.new.append(source)
        elif digest is not None and digest == old.sha256 and old.size == source.size:
            plan.touched.append(source)
        else:
            plan.changed.append(source)
    plan.deleted = sorted(uri for uri in state.files if uri not in seen)
    return plan


def drop_parts(fs: Any, root: str, parts: list[str]) -> None:
    """Remove parts: their manifests first (they stop being committed, so a run killed
    half-way never leaves a committed part with missing files), then their files, in
    every shard folder (a crashed run may have moved files it never recorded). Each
    table's tree is listed once, whatever the number of parts."""
    for part in parts:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(f"{root}/{MANIFEST_DIR}/{part}", recursive=True)
    names = {f"{part}.parquet" for part in parts}
    for table in TABLES:
        for path in fs.glob(f"{root}/{table}/{PARTITION_COLUMN}=*/*.parquet"):
            if posixpath.basename(path) in names:
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(path)


def _part_counts(fs: Any, root: str, part: str) -> dict[str, int]:
    return sum_counts(committed_items(fs, root, part).values())


def _embed_file(cfg: EmbedConfig, fs: Any, root: str) -> EmbedSummary:
    try:
        return embed_corpus(cfg)
    except PlanMismatchError as error:
        # A part left by a crashed run, made from the same content but recorded with
        # another mtime (the file was touched since): its plan no longer matches. It is
        # outside the live view, so dropping it and starting over loses nothing.
        if error.part != cfg.part:
            raise
        with DatasetLock(fs, root):
            drop_parts(fs, root, [cfg.part])
        return embed_corpus(cfg)


@dataclass
class RunResult:
    record: RunRecord
    lines: list[str]
    failed_indexes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.record.status == "failed":
            return 1
        return 1 if self.failed_indexes else 0


def _say(lines: list[str], text: str, echo: bool) -> None:
    lines.append(text)
    if echo:
        print(text, file=sys.stderr)


def run_job(spec: JobSpec, *, trigger: str = "manual", slot: float | None = None,
            clock: Clock = time.time, progress: bool = False, echo: bool = False,
            due_check: Callable[[list[RunRecord]], bool] | None = None) -> RunResult | None:
    """One incremental run; raises ``JobBusyError`` when another run of the job is going.

    ``due_check`` (the scheduler's) is asked again once the lock is held, with the run
    history: a run another scheduler finished a moment ago may have served the slot
    already, and then this returns None without running.
    """
    fs, root = open_fs(spec.output, spec.storage_options or None)
    with job_lock(fs, root):
        if due_check is not None and not due_check(list(iter_runs(fs, root))):
            return None
        record = RunRecord.start(spec.name, trigger, slot, clock())
        lines: list[str] = []
        crashed = mark_crashed_runs(fs, root, clock())
        if crashed:
            _say(lines, f"{spec.name}: previous run {', '.join(crashed)} did not finish; "
                        "resuming its work", echo)
        write_run(fs, root, record)
        try:
            failed = _run_locked(spec, fs, root, record, lines, progress, echo)
        except BaseException as error:
            record.status = "failed"
            record.message = (str(error) or type(error).__name__)[:2000]
            record.ended_at = clock()
            with contextlib.suppress(Exception):
                write_run(fs, root, record)
            raise
        record.ended_at = clock()
        write_run(fs, root, record)
        return RunResult(record, lines, failed)


def _run_locked(spec: JobSpec, fs: Any, root: str, record: RunRecord, lines: list[str],
                progress: bool, echo: bool) -> list[str]:
    import fsspec

    state = read_state(fs, root, spec.name)
    # Readers follow _live.json; make it agree with state.json before anything else (a
    # run killed between its two commit writes, a dataset from before _live.json, or a
    # first run: an empty live view hides the parts this run is about to build).
    live = read_live(fs, root)
    if live is None or set(live.get("parts", [])) != state.live_parts:
        publish_live(fs, root, state.live_parts)
    sources = list_sources(list(spec.sources), spec.storage_options or None,
                           bool(spec.embed.get("allow_missing", False)))
    source_fs: dict[str, Any] = {}

    def fs_for(uri: str) -> Any:
        protocol = uri.split("://", 1)[0] if "://" in uri else "file"
        if protocol not in source_fs:
            source_fs[protocol] = fsspec.filesystem(protocol, **(spec.storage_options or {}))
        return source_fs[protocol]

    plan = plan_run(fs_for, sources, state, spec.hash_max_bytes)
    record.files = plan.counts(spec.delete_missing)
    for source in plan.touched:  # same content: only the fingerprint moves
        old = state.files[source.uri]
        old.size, old.version = source.size, source.version

    wanted: dict[str, tuple[Any, str]] = {}
    for source in plan.new + plan.changed:
        digest = plan.digests[source.uri]
        wanted[source.uri] = (source, part_name(source.uri, source.size, source.version,
                                                digest))
    # Parts outside the live view and not about to be (re)built are garbage from an
    # earlier version or a crashed run; parts we are about to build are kept, so the
    # pipeline resumes their committed items instead of recomputing them.
    # An index that still reflects an old part needs its documents to delete its rows.
    keep = (state.live_parts | {part for _, part in wanted.values()}
            | referenced_parts(fs, root, spec.mixes))
    _collect_garbage(fs, root, keep)

    if not plan.has_work(spec.delete_missing):
        record.status = "no-changes"
        kept = f"; {len(plan.deleted)} missing files kept (delete_missing = false)" if (
            plan.deleted) else ""
        _say(lines, f"{spec.name}: no changes ({plan.unchanged + len(plan.touched)} files "
                    f"unchanged{kept}); no model work done", echo)
        if plan.touched:
            write_state(fs, root, state)
        # A refresh that failed or was killed last time is completed now, and then the
        # parts it no longer reflects can go.
        failed = _refresh(spec, fs, root, state, record, lines, echo)
        _collect_garbage(fs, root,
                         state.live_parts | referenced_parts(fs, root, spec.mixes))
        return failed

    _embed_wanted(spec, fs, root, state, wanted, record, lines, progress, echo)
    _commit_run(spec, fs, root, state, plan, wanted)
    record.status = "ok"
    c = record.files
    _say(lines, f"{spec.name}: {c['new']} new, {c['changed']} changed, {c['deleted']} deleted, "
                f"{c['unchanged'] + c['touched']} unchanged files; embedded {record.documents} "
                f"documents, {record.tokens} tokens ({record.errors} errors)", echo)
    if plan.deleted and not spec.delete_missing:
        _say(lines, f"{spec.name}: {len(plan.deleted)} source files are gone; their rows are "
                    "kept (set delete_missing = true to remove them)", echo)
    # Replaced and deleted parts go now unless an index still holds their rows (it needs
    # their documents to delete them); an index built from scratch then sees live parts only.
    _collect_garbage(fs, root,
                     state.live_parts | referenced_parts(fs, root, spec.mixes))
    failed = _refresh(spec, fs, root, state, record, lines, echo)
    _collect_garbage(fs, root,
                     state.live_parts | referenced_parts(fs, root, spec.mixes))
    return failed


def _embed_wanted(spec: JobSpec, fs: Any, root: str, state: JobState,
                  wanted: dict[str, tuple[Any, str]], record: RunRecord, lines: list[str],
                  progress: bool, echo: bool) -> None:
    """Embed each new or changed file into its part. The model is resolved once; each file
    is a run of its own over the job's globs (ids stay relative to the glob's prefix)
    restricted to that one file."""
    base = replace(spec.embed_config(), progress=progress)
    with ray_session(base), reuse_models():  # in-process: one model load per run
        for i, (uri, (source, part)) in enumerate(sorted(wanted.items()), start=1):
            kind = "new" if uri not in state.files else "changed"
            cfg = replace(base, source_files=(source,), part=part)
            summary = _embed_file(cfg, fs, root)
            counts = _part_counts(fs, root, part)
            record.documents += summary.documents
            record.sentences += summary.sentences
            record.tokens += summary.tokens
            record.errors += summary.errors
            _say(lines, f"[{i}/{len(wanted)}] {kind} {source.relative}: "
                        f"{counts.get('documents', 0)} documents, {counts.get('tokens', 0)} "
                        f"tokens, {counts.get('errors', 0)} errors -> part {part}", echo)


def _commit_run(spec: JobSpec, fs: Any, root: str, state: JobState, plan: RunPlan,
                wanted: dict[str, tuple[Any, str]]) -> None:
    """Record the embedded files in the job's state, then switch the readers' view."""
    for uri, (source, part) in wanted.items():
        counts = _part_counts(fs, root, part)
        state.files[uri] = FileRecord(uri=uri, size=source.size, version=source.version,
                                      sha256=plan.digests[uri], part=part,
                                      documents=counts.get("documents", 0),
                                      tokens=counts.get("tokens", 0),
                                      errors=counts.get("errors", 0))
    if spec.delete_missing:
        for uri in plan.deleted:
            del state.files[uri]
    write_state(fs, root, state)  # the job's commit point
    publish_live(fs, root, state.live_parts)  # the readers' commit point: the view switches


def _collect_garbage(fs: Any, root: str, keep: set[str]) -> None:
    """Drop the job's parts outside ``keep`` (old versions, a crashed run's leftovers)."""
    # Never a part that _live.json lists: a reader may be reading it right now.
    keep = keep | set((read_live(fs, root) or {}).get("parts", []))
    garbage = [p for p in iter_parts(fs, root) if p.startswith(PART_PREFIX) and p not in keep]
    if garbage:
        # The dataset lock too: an `elmo embed` into this output must not see half a part.
        with DatasetLock(fs, root):
            drop_parts(fs, root, garbage)


def _refresh(spec: JobSpec, fs: Any, root: str, state: JobState, record: RunRecord,
             lines: list[str], echo: bool) -> list[str]:
    failed = []
    for mix, result in refresh_indexes(spec, fs, root, state.live_parts).items():
        record.index[mix] = result
        if result.startswith("failed"):
            failed.append(mix)
        if result != "up to date" or record.status != "no-changes":
            _say(lines, f"{spec.name}: index {mix}: {result}", echo)
    return failed
