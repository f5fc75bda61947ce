"""The manifest and the live view: which files of a dataset are committed, and which of
them readers read (docs/dataset_format.md, "Manifest" and "Live view").

A *shard* is the stored files of one work item: ``<table>/shard=<k>/<part>.parquet``
(``shard`` is the public layout's hive partition column). The write path commits a
shard by writing its *commit record*, ``_manifest/<part>/shard=<k>.json``, after its
files are in place: a shard is committed if and only if its record exists.

What readers read is the *live view* (``list_files``): the shards listed by
``_live.json`` when a writer that swaps parts (jobs) has published one
(``publish_live``), else every committed shard. Every reader in this project goes
through it; the file is plain JSON so that readers without our code can do the same.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from hashlib import sha256
from typing import Any, NamedTuple

from elmo_model.errors import ElmoUserError
from schemas.files import is_local, protocols, read_json, write_bytes_atomic
from schemas.layout import PARTITION_COLUMN, TABLES
from schemas.user_cache import cache_dir, listed_version, load_json, save_json

MANIFEST_DIR = "_manifest"
LIVE_FILE = "_live.json"
LIVE_FORMAT = "elmo-store/live"
LIVE_VERSION = 1
RECORDS_CACHE = "commit-records"  # per-user cache folder of object stores' commit records


def table_file(root: str, table: str, item: int, part: str) -> str:
    """Where work item ``item``'s file of ``table`` lives: its shard's folder."""
    return f"{root}/{table}/{PARTITION_COLUMN}={item}/{part}.parquet"


def manifest_path(root: str, part: str, item: int) -> str:
    """Work item ``item``'s commit record."""
    return f"{root}/{MANIFEST_DIR}/{part}/{PARTITION_COLUMN}={item}.json"


# --------------------------------------------------------------------------- the live view


@dataclass(frozen=True)
class LiveShard:
    """One committed shard of one part that readers should read."""

    part: str
    shard: int
    run_id: str
    files: dict[str, str]  # table -> path relative to the root; no entry: no rows

    @property
    def key(self) -> str:
        """``part/shard=k/run_id``: names this shard's content (a re-embedded shard gets a
        new run id), e.g. for an index that records what it holds."""
        return f"{self.part}/{PARTITION_COLUMN}={self.shard}/{self.run_id}"

    def path(self, root: str, table: str) -> str | None:
        rel = self.files.get(table)
        return None if rel is None else f"{root}/{rel}"


class ShardFile(NamedTuple):
    """One file of one table: ``key`` names its shard's content (``LiveShard.key``)."""

    key: str
    path: str

    @property
    def part(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def shard(self) -> int:
        """The shard number, from the key's ``shard=k`` (the hive partition value)."""
        return int(self.key.split("/")[1].split("=", 1)[1])


def shard_from_entry(entry: dict, part: str, shard: int) -> LiveShard:
    """A committed shard from its manifest entry."""
    files = entry.get("files")
    if files is None:  # not written by this code: assume the four files at their names
        files = {t: f"{t}/{PARTITION_COLUMN}={shard}/{part}.parquet" for t in TABLES}
    return LiveShard(part, shard, str(entry.get("run_id", "")), dict(files))


def committed_items(fs: Any, root: str, part: str) -> dict[int, dict]:
    """The commit records of ``part``'s committed work items, by item (shard) number."""
    folder = f"{root}/{MANIFEST_DIR}/{part}"
    try:
        listed = fs.ls(folder, detail=True)
    except FileNotFoundError:
        return {}
    records: dict[int, dict] = {}
    for info in listed:
        base = posixpath.basename(info["name"])
        if base.startswith(f"{PARTITION_COLUMN}=") and base.endswith(".json"):
            records[int(base[len(PARTITION_COLUMN) + 1 : -5])] = info
    if is_local(fs):
        entries = {shard: read_json(fs, info["name"]) for shard, info in records.items()}
    else:
        entries = _remote_records(fs, folder, records)
    return {shard: entry for shard, entry in entries.items() if entry is not None}


def _remote_records(fs: Any, folder: str, records: dict[int, dict]) -> dict[int, dict | None]:
    """The commit records ``records`` (shard -> listing entry) of one manifest folder on an
    object store, where each read is a request: the versions read before (same size and
    change time or ETag in the listing) come from the per-user cache, the rest are fetched
    in one concurrent ``fs.cat``. Without this every reader paid one sequential GET per
    work item on each open (thousands at corpus scale)."""
    where = f"{protocols(fs)[0]}://{fs._strip_protocol(folder)}"
    cache_file = cache_dir() / RECORDS_CACHE / f"{sha256(where.encode()).hexdigest()[:32]}.json"
    cached = load_json(cache_file)
    cached = cached.get("records", {}) if isinstance(cached, dict) \
        and cached.get("folder") == where else {}
    entries: dict[int, dict | None] = {}
    kept: dict[str, dict] = {}
    fetch: dict[int, tuple[str, str | None]] = {}
    for shard, info in records.items():
        name, version = posixpath.basename(info["name"]), listed_version(info)
        hit = cached.get(name)
        if version is not None and isinstance(hit, dict) and hit.get("version") == version \
                and isinstance(hit.get("entry"), dict):
            entries[shard], kept[name] = hit["entry"], hit
        else:
            fetch[shard] = (info["name"], version)
    if fetch:
        data = fs.cat([path for path, _ in fetch.values()], on_error="return")
        data = {fs._strip_protocol(path): raw for path, raw in data.items()}
        for shard, (path, version) in fetch.items():
            raw = data.get(fs._strip_protocol(path))
            if isinstance(raw, FileNotFoundError) or raw is None:
                entries[shard] = None  # deleted since the listing: not committed now
                continue
            if isinstance(raw, BaseException):  # never a committed item silently left out
                raise raw
            entries[shard] = json.loads(raw)
            if version is not None:
                kept[posixpath.basename(path)] = {"version": version, "entry": entries[shard]}
    if kept != cached:
        save_json(cache_file, {"folder": where, "records": kept})
    return entries


def iter_parts(fs: Any, root: str) -> Iterator[str]:
    """Every part with a manifest folder, live or not: the *writer's* listing (resume,
    garbage collection). Readers use :func:`live_shards`."""
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(fs.ls(f"{root}/{MANIFEST_DIR}", detail=False)):
            yield posixpath.basename(path)


def read_live(fs: Any, root: str) -> dict | None:
    """``_live.json``, or None when no writer has published a live view."""
    data = read_json(fs, f"{root}/{LIVE_FILE}")
    if data is not None and (data.get("format") != LIVE_FORMAT
                             or data.get("version") != LIVE_VERSION):
        raise ElmoUserError(f"{root}/{LIVE_FILE}: format {data.get('format')!r} version "
                            f"{data.get('version')!r} is not {LIVE_FORMAT} {LIVE_VERSION}; "
                            "written by another elmo-store release")
    return data


def live_shards(fs: Any, root: str) -> list[LiveShard]:
    """The shards a reader should read, sorted by (part, shard).

    With ``_live.json`` present: exactly the shards it lists (one atomic read, so a
    reader gets one version of everything even while a writer builds or deletes other
    parts). Without it (a dataset only ``elmo embed`` writes): every committed shard of
    every part.
    """
    live = read_live(fs, root)
    if live is not None:
        return sorted((LiveShard(str(s["part"]), int(s["shard"]), str(s.get("run_id", "")),
                                 dict(s.get("files", {}))) for s in live.get("shards", [])),
                      key=lambda s: (s.part, s.shard))
    return _part_shards(fs, root, iter_parts(fs, root))


def live_parts(fs: Any, root: str) -> list[str]:
    """Names of the parts in the live view (see :func:`live_shards`)."""
    live = read_live(fs, root)
    if live is not None:
        return sorted(str(p) for p in live.get("parts", []))
    return list(iter_parts(fs, root))


def _part_shards(fs: Any, root: str, parts: Iterable[str]) -> list[LiveShard]:
    return [shard_from_entry(entry, part, shard)
            for part in parts
            for shard, entry in sorted(committed_items(fs, root, part).items())]


def list_files(fs: Any, root: str, table: str = "tokens",
               parts: Iterable[str] | None = None) -> list[ShardFile]:
    """The files of one table, in (part, shard) order: the live view, or with ``parts``
    every committed shard of those parts, live or not (a writer's view of what it made).
    A shard whose table has no rows has no file and is left out. A derived table
    (``derived_tables``: ``senses``) lists the files its own registry names."""
    from schemas.derived_tables import DERIVED_SCHEMAS, derived_paths

    if table in DERIVED_SCHEMAS:
        return [ShardFile(key, path) for key, path in derived_paths(fs, root, table)]
    shards = live_shards(fs, root) if parts is None else _part_shards(fs, root, sorted(parts))
    return [ShardFile(s.key, path) for s in shards
            if (path := s.path(root, table)) is not None]



# --------------------------------------------------------------------------- counts


def sum_counts(entries: Iterable[dict]) -> dict[str, int]:
    """The manifest entries' ``counts`` summed by key (an entry without counts adds
    nothing; a key missing from some entries is summed over the others)."""
    totals: dict[str, int] = {}
    for entry in entries:
        for key, value in entry.get("counts", {}).items():
            totals[key] = totals.get(key, 0) + int(value)
    return totals


def live_counts(fs: Any, root: str) -> dict[str, int]:
    """Row counts of the live view (what readers see), from the manifest."""
    return sum_counts(entry for part in live_parts(fs, root)
                      for entry in committed_items(fs, root, part).values())


# --------------------------------------------------------------------------- publishing


def publish_live(fs: Any, root: str, parts: set[str] | list[str]) -> dict:
    """Make ``parts`` (and nothing else) the live view, in one atomic write.

    Every shard of every listed part must be committed already: the file names the
    shards as they are now, so what it lists never changes under a reader. Callers hold
    the dataset's writer lock or their own (jobs hold the job lock).
    """
    shards = []
    for part in sorted(set(parts)):
        for shard, entry in sorted(committed_items(fs, root, part).items()):
            s = shard_from_entry(entry, part, shard)
            shards.append({"part": s.part, "shard": s.shard, "run_id": s.run_id,
                           "files": dict(sorted(s.files.items()))})
    previous = read_json(fs, f"{root}/{LIVE_FILE}") or {}
    data = {"format": LIVE_FORMAT, "version": LIVE_VERSION,
            "generation": int(previous.get("generation", 0)) + 1,
            "updated_at": time.time(), "parts": sorted(set(parts)), "shards": shards}
    write_bytes_atomic(fs, f"{root}/{LIVE_FILE}", json.dumps(data, indent=1).encode())
    return data

