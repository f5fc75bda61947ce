"""An index build is atomic as a whole: readers see the index as the last finished build
left it, whatever a build under way (or one killed at any moment) has written since.

The commit is the atomic write of ``_elmo_index.json``: it names the LanceDB table
``versions`` it goes with, and every other file of its build by a name no other build uses
(``_ivf/<folder>``, ``word_counts_file``, ``selected_file``). Readers check those versions
out (``open_tables``), so rows a build adds, deletes or overwrites (``--rebuild``
overwrites the tables: a new version, the old ones still readable) are seen by no one
until the JSON names them. A build starts by putting the tables back at the versions the
JSON names (``restore_published``: a stopped build's later versions are discarded) or,
when those cannot be found (``damage``, in its plan), by building the index anew; it
ends by writing the JSON (``publish``), after which it removes what neither this build
nor the one before it names (``clean_up``). The build before is kept so that a reader
that opened it (a server between two requests, a search under way) finishes on it: it
goes at the next build.
"""

from __future__ import annotations

import functools
import inspect
import posixpath
import threading
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.ivf_build import drop_other_folders
from pipeline.lookup.index.ivf_shards import is_sharded
from pipeline.lookup.index.ivf_shards_build import ivf_folders
from pipeline.lookup.index.meta import (
    INDEX_META,
    TABLE,
    WORD_COUNTS,
    IndexMeta,
    build_command,
    read_meta,
)
from pipeline.lookup.index.sentences import SENTENCES_TABLE
from pipeline.lookup.index.words import SELECTED_WORDS
from schemas.dataset import open_fs, write_bytes_atomic
from schemas.lock import DatasetLock

# optimize() without cleanup: LanceDB's default (7 days) could remove the version the
# JSON names while a build is under way, if the index was last built longer ago.
NO_CLEANUP = timedelta(days=365 * 100)
# Versions this much older than the one kept may stay: LanceDB's "now" is read a moment
# after ours, and the kept version must never fall on the wrong side of its cut.
CLEANUP_MARGIN = timedelta(seconds=1)
# Prefixes of the per-build files in the index root (cleaned like IVF folders).
BUILD_FILES = (WORD_COUNTS.removesuffix(".parquet"), SELECTED_WORDS.removesuffix(".parquet"))


Build = TypeVar("Build", bound=Callable[..., Any])
_HELD: set[str] = set()  # indexes this process is building (a refresh may call a build)
_HELD_LOCK = threading.Lock()


def one_build_at_a_time(uri_argument: str) -> Callable[[Build], Build]:
    """Decorates a build entry point whose argument ``uri_argument`` is the index: it holds
    the index's ``_lock`` (``schemas.lock``, as a dataset's writers do) while it runs, so a
    second build of the same index at once stops with one line; a lock whose owner died
    (a killed build) is taken over."""
    def decorate(build: Build) -> Build:
        signature = inspect.signature(build)

        @functools.wraps(build)
        def locked(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs).arguments
            uri = str(bound[uri_argument])
            with _HELD_LOCK:
                mine = uri in _HELD
            if mine:
                return build(*args, **kwargs)
            fs, root = open_fs(uri, bound.get("storage_options"))
            new = not fs.exists(root)
            try:
                with DatasetLock(fs, root):
                    with _HELD_LOCK:
                        _HELD.add(uri)
                    try:
                        return build(*args, **kwargs)
                    finally:
                        with _HELD_LOCK:
                            _HELD.discard(uri)
            finally:
                # A build refused before it wrote anything leaves no folder behind.
                if new and fs.exists(root) and not fs.ls(root, detail=False):
                    fs.rmdir(root)
        return locked  # type: ignore[return-value]
    return decorate


def build_file(base: str) -> str:
    """A name for one build's copy of ``base`` (``_word_counts.parquet``): no other build
    writes it, so a build stopped before its commit leaves the published one as it was."""
    stem, dot, ext = base.partition(".")
    return f"{stem}-{uuid.uuid4().hex[:12]}{dot}{ext}"


def published_versions(meta: IndexMeta) -> dict[str, int]:
    """Table name -> the version the index's JSON goes with (empty: an index built before
    versions were recorded, whose readers take the latest; a compact one pinned its token
    table in ``ivf``)."""
    if meta.versions:
        return dict(meta.versions)
    if is_sharded(meta.ivf) and meta.ivf.get("table_version") is not None:
        return {TABLE: int(meta.ivf["table_version"])}
    return {}


def rebuild_command(meta: IndexMeta, uri: str) -> str:
    return build_command(meta, uri, "--rebuild")


def damage(db: Any, meta: IndexMeta) -> str | None:
    """Why the index the JSON describes cannot be read back from ``db`` (None: it can)."""
    names = set(db.list_tables().tables)
    wanted = [TABLE, *([SENTENCES_TABLE] if meta.layout >= 2 else [])]
    for name in wanted:
        if name not in names:
            return f"its table {name!r} is missing"
    versions = published_versions(meta)
    for name, version in versions.items():
        if version not in {v["version"] for v in db.open_table(name).list_versions()}:
            return f"its table {name!r} no longer has version {version}, which it was built as"
    if TABLE not in versions:
        # Built before versions were recorded: the latest rows must be those it counted.
        rows = db.open_table(TABLE).count_rows()
        if rows != meta.rows:
            return (f"its table holds {rows} rows where its metadata counts {meta.rows} (a "
                    "build was stopped half way)")
    return None


def restore_published(db: Any, meta: IndexMeta, uri: str,
                      progress: Callable[[str], None] | None = None) -> None:
    """The tables of the index of ``meta`` (readable: ``damage``) back at the versions its
    JSON names, discarding what a stopped build wrote since."""
    for name, version in published_versions(meta).items():
        table = db.open_table(name)
        if table.version != version:
            if progress:
                progress(f"{uri}: discarding what a stopped build wrote to {name!r} "
                         f"(version {table.version}; back to {version})")
            table.restore(version)


def cleanup_age(table: Any, keep: int | None, drop_all: bool = False) -> timedelta:
    """``optimize(cleanup_older_than=...)`` that removes the versions of ``table`` older than
    version ``keep`` and keeps it (None: keep every version; ``drop_all``: all but the
    latest, for a table no reader has opened)."""
    if drop_all:
        return timedelta(0)
    if keep is None:
        return NO_CLEANUP
    stamps = {v["version"]: v["timestamp"] for v in table.list_versions()}
    if keep not in stamps:
        return NO_CLEANUP
    kept = stamps[keep]
    return max(timedelta(0), datetime.now(kept.tzinfo) - kept) + CLEANUP_MARGIN


def open_tables(db: Any, meta: IndexMeta, uri: str) -> tuple[Any, Any]:
    """The index's token and sentence tables (None: layout 1) at the versions its JSON
    names; one line naming the fix when they cannot be."""
    versions = published_versions(meta)
    fix = rebuild_command(meta, uri)
    try:
        names = set(db.list_tables().tables)
        opened = []
        for name in (TABLE, SENTENCES_TABLE if meta.layout >= 2 else None):
            if name is None:
                opened.append(None)
                continue
            if name not in names:
                raise ElmoUserError(f"{uri}: its table {name!r} is missing; {fix} makes "
                                    "the index again")
            table = db.open_table(name)
            if name in versions and table.version != versions[name]:
                table.checkout(versions[name])
            opened.append(table)
        if TABLE not in versions and opened[0].count_rows() != meta.rows:
            raise ElmoUserError(
                f"{uri}: its table holds {opened[0].count_rows()} rows where its metadata "
                f"counts {meta.rows} (a build was stopped half way); {fix} makes it again")
    except (ValueError, OSError, RuntimeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ElmoUserError(f"{uri}: its tables cannot be read as built ({reason}); {fix} "
                            "makes the index again") from error
    return opened[0], opened[1]


def publish(uri: str, meta: IndexMeta, versions: dict[str, int],
            storage_options: dict | None = None) -> None:
    """The commit: ``meta`` with its tables' ``versions`` written whole over the JSON,
    then what neither it nor the build it replaces names is removed (``clean_up``)."""
    previous = read_meta(uri, storage_options)
    meta.versions = versions
    fs, root = open_fs(uri, storage_options)
    write_bytes_atomic(fs, f"{root}/{INDEX_META}", meta.to_json().encode())
    clean_up(fs, root, [meta] + ([previous] if previous is not None else []))


def clean_up(fs: Any, root: str, kept: Iterable[IndexMeta]) -> None:
    """Remove the IVF folders and per-build files that none of ``kept`` names, and the
    temporary files of a write that was stopped."""
    kept = list(kept)
    drop_other_folders(fs, root, [f for m in kept for f in ivf_folders(m.ivf)])
    names = {n for m in kept for n in (m.word_counts_file or WORD_COUNTS,
                                      m.selected_file or SELECTED_WORDS)}
    try:
        present = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)]
    except FileNotFoundError:
        return
    for name in present:
        stray = name.startswith(BUILD_FILES) and name not in names
        if stray or (name.endswith(".tmp") and name.startswith((INDEX_META, *BUILD_FILES))):
            fs.rm(f"{root}/{name}")
