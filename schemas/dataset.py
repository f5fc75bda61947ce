"""Opening a stored dataset and listing the files a reader reads.

    ds = open_dataset("s3://bucket/ds")         # descriptor, file system, root path
    for f in ds.shard_files("tokens"):          # the live view: part/shard=k/run_id, path
        ...

- ``open_fs`` turns a URI and storage options into ``(fsspec file system, root path)``:
  every reader and writer in this project opens a location through it.
- ``list_files`` is the one listing of a table's files: the *live view* by default
  (``_live.json`` when a writer that swaps parts, the jobs runner, has published one, else
  every committed shard of every part; docs/dataset_format.md, "Live view"), or every
  committed shard of the parts a writer names.
- ``Dataset`` holds an opened dataset; its mixes (``_mixes.json``) are read and written here.

Paths inside: everything below takes and returns paths of ``fs`` (no protocol); URIs
appear only where a caller outside hands them in or needs them out (``Dataset.uri_of``).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from hashlib import sha256
from typing import Any, NamedTuple

from elmo_model.errors import ElmoUserError
from schemas import DESCRIPTOR_FILE, PARTITION_COLUMN, TABLES, DatasetDescriptor
from schemas.mix_specs import (
    MIXES_FILE,
    Mix,
    check_name,
    mixes_file_bytes,
    parse_mixes_file,
    resolve_mix,
)

MANIFEST_DIR = "_manifest"
LIVE_FILE = "_live.json"
LIVE_FORMAT = "elmo-store/live"
LIVE_VERSION = 1
RECORDS_CACHE = "commit-records"  # per-user cache folder of object stores' commit records


def open_fs(uri: str, storage_options: dict | None = None) -> tuple[Any, str]:
    """(fsspec file system, root path without protocol or trailing slash) for a URI."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(str(uri), **(storage_options or {}))
    return fs, root.rstrip("/")


def protocols(fs: Any) -> tuple[str, ...]:
    """The file system's protocol names, its main one first (fsspec gives a str or a
    tuple)."""
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def is_local(fs: Any) -> bool:
    return "file" in protocols(fs)


def read_json(fs: Any, path: str) -> dict | None:
    try:
        with fs.open(path, "rb") as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        return None


def write_bytes_atomic(fs: Any, path: str, data: bytes) -> None:
    """Write to a temporary sibling, then move into place: readers see all or nothing."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    with fs.open(tmp, "wb") as handle:
        handle.write(data)
    fs.mv(tmp, path)


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


def committed_shards(fs: Any, root: str, part: str) -> dict[int, dict]:
    """Manifest entries of the committed shards of ``part``, by shard number."""
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
    from schemas.user_cache import cache_dir, listed_version, load_json, save_json

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
            for shard, entry in sorted(committed_shards(fs, root, part).items())]


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


# --------------------------------------------------------------------------- datasets


@dataclass
class Dataset:
    """A readable dataset: descriptor, file system, root path and its live files."""

    uri: str
    descriptor: DatasetDescriptor
    fs: Any
    root: str
    storage_options: dict | None = None

    def shard_files(self, table: str = "tokens", parts: Iterable[str] | None = None
                    ) -> list[ShardFile]:
        """``list_files`` of this dataset: ``(key, path)`` per file."""
        return list_files(self.fs, self.root, table, parts)

    def paths(self, table: str = "tokens") -> list[str]:
        """Paths (for ``fs``) of the live files of one table."""
        return [f.path for f in self.shard_files(table)]

    @property
    def is_local(self) -> bool:
        return is_local(self.fs)

    def uri_of(self, path: str) -> str:
        """The URI of one of this dataset's paths, for readers outside fsspec."""
        return self.fs.unstrip_protocol(path)

    def arrow_filesystem(self) -> Any:
        import pyarrow.fs as pafs

        if self.is_local:
            return pafs.LocalFileSystem()
        return pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))

    def mixes(self) -> dict[str, Mix]:
        """The mixes stored with the dataset (built-ins are not stored)."""
        data = read_json(self.fs, f"{self.root}/{MIXES_FILE}")
        return {} if data is None else parse_mixes_file(data, f"{self.uri}/{MIXES_FILE}")

    def mix(self, spec: str | Mapping[str, Any] | Mix) -> Mix:
        if self.descriptor.n_output_layers < 1:
            raise ElmoUserError(f"{self.uri} stores no layers to mix")
        return resolve_mix(spec, self.descriptor.n_output_layers, self.mixes())

    def save_mix(self, mix: Mix) -> None:
        """Add or replace one named mix in ``_mixes.json`` (read-modify-write, atomic
        move; writers of mixes take no lock: last writer wins)."""
        check_name(mix.name)
        if mix.n_layers != self.descriptor.n_output_layers:
            raise ElmoUserError(f"mix {mix.name!r} has {mix.n_layers} weights; the dataset "
                                f"has {self.descriptor.n_output_layers} layers")
        mixes = self.mixes()
        mixes[mix.name] = mix
        write_bytes_atomic(self.fs, f"{self.root}/{MIXES_FILE}", mixes_file_bytes(mixes))


def _descriptor(fs: Any, root: str, uri: str) -> DatasetDescriptor:
    data = read_json(fs, f"{root}/{DESCRIPTOR_FILE}")
    if data is None:
        raise ElmoUserError(f"{uri} is not an elmo-store dataset (no {DESCRIPTOR_FILE})")
    try:
        return DatasetDescriptor.from_json(json.dumps(data))
    except (ValueError, TypeError) as error:
        raise ElmoUserError(f"{uri}: unreadable dataset descriptor ({error})") from None


def read_dataset_descriptor(uri: str, storage_options: dict | None = None
                            ) -> DatasetDescriptor:
    return _descriptor(*open_fs(uri, storage_options), str(uri))


def open_dataset(uri: str, storage_options: dict | None = None) -> Dataset:
    fs, root = open_fs(uri, storage_options)
    return Dataset(str(uri), _descriptor(fs, root, str(uri)), fs, root, storage_options)


def load_mixes(dataset: str, storage_options: dict | None = None) -> dict[str, Mix]:
    """The mixes stored in a dataset (built-ins are not stored)."""
    return open_dataset(dataset, storage_options).mixes()


def save_mix(dataset: str, mix: Mix, storage_options: dict | None = None) -> None:
    open_dataset(dataset, storage_options).save_mix(mix)
