"""Check every committed file of a dataset against its manifest.

Each commit record (``_manifest/<part>/shard=<k>.json``, pipeline/write/commit.py) names its
item's files with their size, sha256 and row count. ``verify_dataset`` reads every such
file once, front to back, and reports one ``FileCheck`` per file: present, the recorded
size, the recorded hash, then (from the footer, which the read just passed over) the
recorded row count and the schema the descriptor implies. A damaged file names the part
and the work item that produced it, which is what ``elmo embed --repair`` re-embeds.

Records written before hashes were recorded have no ``sha256``: their files are checked
for size, rows and schema only, and their checks say so.

Readers that cannot check Parquet page checksums themselves (DuckDB, behind `elmo sql`,
``open_dataset().sql()`` and `elmo serve`'s /sql) call ``require_intact`` first. It
remembers each file version it found intact (path, recorded hash, size, and what the
store's listing says of the version: locally the modification time, the inode's change
time and the inode; on object stores the ETag or time) in a per-user cache, so a file is
read once per version, not once per query; a file changed by any write, even one that puts
its modification time back, is a new version and is read again. A version is trusted for
``RECHECK_AFTER_S`` at most, then read again: that bounds how long a change no write made
(rot of the medium itself) can go unseen. docs/dataset_format.md, "Integrity", has the
costs measured. `elmo dataset verify` always reads everything.

Derived tables (``_derived.json``) are checked as the committed files are, but a damaged
or missing one stops only the queries of its own table (``VerifyReport.derived_problems``),
and its line names the command that writes it again (relabel), not ``--repair``.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from elmo_model.errors import ElmoUserError
from schemas import TABLE_SCHEMAS, DatasetDescriptor
from schemas.dataset import open_dataset
from schemas.derived_tables import DERIVED_SCHEMAS, derived_fix, expected_derived
from schemas.files import protocols
from schemas.manifest import committed_items, iter_parts, shard_from_entry
from schemas.user_cache import cache_dir, listed_version, load_json, save_json

OK = "ok"
MISSING = "missing"
TRUNCATED = "truncated"  # shorter than recorded
SIZE_MISMATCH = "size mismatch"  # longer than recorded
CORRUPT = "corrupt"  # the recorded size, other bytes
ROW_COUNT = "row count mismatch"
SCHEMA = "schema mismatch"
UNREADABLE = "unreadable"  # the right bytes by size, but no Parquet footer to read

READ_BYTES = 8 << 20  # one read's size: large sequential reads, bounded memory per thread
FOOTER_TAIL = 1 << 20  # bytes kept from the end of each file to parse the footer from
VERIFY_THREADS = 4  # hashing releases the GIL; object stores gain from requests in flight
VERIFIED_FILE = "verified-files.json"
VERIFIED_MAX = 500_000  # file versions remembered (64 hex characters each); oldest go first
RECHECK_AFTER_S = 24 * 3600.0  # a version found intact is read again after this long
DERIVED_PART = "derived"  # the part name derived files' checks carry


@dataclass(frozen=True)
class FileCheck:
    """The verdict on one committed file."""

    part: str
    item: int
    table: str
    path: str  # relative to the dataset root
    status: str
    detail: str = ""
    source: dict = field(default_factory=dict)  # the item's input: source, start, end
    bytes_read: int = 0

    @property
    def ok(self) -> bool:
        return self.status == OK

    def line(self) -> str:
        """One line for people: what is wrong, where, and which work item made it."""
        where = self.source.get("source")
        if self.part == DERIVED_PART:  # no embed made it: name the command that rewrites it
            return f"{self.status}: {self.path}: {self.detail} [{where}: {self.source['fix']}]"
        made_by = f"part {self.part} item {self.item}" + (
            f" ({where} bytes {self.source.get('start')}-{self.source.get('end')})"
            if where else "")
        return f"{self.status}: {self.path}: {self.detail} [{made_by}]"


@dataclass
class VerifyReport:
    files: list[FileCheck]

    @property
    def problems(self) -> list[FileCheck]:
        return [f for f in self.files if not f.ok]

    @property
    def core_problems(self) -> list[FileCheck]:
        """Problems in files an embed committed (``elmo embed --repair`` mends them)."""
        return [f for f in self.problems if f.part != DERIVED_PART]

    @property
    def derived_problems(self) -> list[FileCheck]:
        """Problems in derived tables' files (their writer's command mends them)."""
        return [f for f in self.problems if f.part == DERIVED_PART]

    @property
    def bytes_checked(self) -> int:
        return sum(f.bytes_read for f in self.files)

    def bad_items(self) -> dict[str, set[int]]:
        """Part -> the work items with at least one damaged file."""
        bad: dict[str, set[int]] = {}
        for check in self.problems:
            bad.setdefault(check.part, set()).add(check.item)
        return bad

    def to_json(self) -> dict:
        return {"ok": not self.problems, "files_checked": len(self.files),
                "bytes_checked": self.bytes_checked,
                "problems": [asdict(f) | {"line": f.line()} for f in self.problems]}


@dataclass(frozen=True)
class ExpectedFile:
    """One file as its commit record describes it (None: not recorded)."""

    part: str
    item: int
    table: str
    path: str
    size: int | None
    sha256: str | None
    rows: int | None
    source: dict


def expected_files(fs: Any, root: str, parts: Iterable[str] | None = None) -> list[ExpectedFile]:
    """What the manifest says is committed: every file of every committed item of
    ``parts`` (default: every part, live or not)."""
    out = []
    for part in sorted(parts) if parts is not None else iter_parts(fs, root):
        for item, entry in sorted(committed_items(fs, root, part).items()):
            shard = shard_from_entry(entry, part, item)
            for table, rel in sorted(shard.files.items()):
                out.append(ExpectedFile(
                    part, item, table, rel, entry.get("bytes", {}).get(table),
                    entry.get("sha256", {}).get(table), entry.get("counts", {}).get(table),
                    dict(entry.get("item", {}))))
    return out


def expected_derived_files(fs: Any, root: str) -> list[ExpectedFile]:
    """Every derived table's file (``_derived.json``), as ``expected_files`` gives the
    committed ones: part ``derived``, the key (a labelled word) as its source."""
    return [ExpectedFile(DERIVED_PART, 0, table, entry["path"], entry.get("bytes"),
                         entry.get("sha256"), entry.get("rows"),
                         {"source": f"{table} of {key!r}", "fix": derived_fix(table, key)})
            for table, key, entry in expected_derived(fs, root)]


def verify_dataset(fs: Any, root: str, descriptor: DatasetDescriptor,
                   parts: Iterable[str] | None = None,
                   on_bytes: Callable[[int], None] | None = None,
                   threads: int = VERIFY_THREADS,
                   wanted: list[ExpectedFile] | None = None) -> VerifyReport:
    """Check every committed file of ``parts`` (default: all; or the files ``wanted``,
    from ``expected_files``) against its commit record and the schema ``descriptor``
    implies. ``on_bytes`` is told of each read's size (a progress bar). Reads the files;
    changes nothing."""
    if wanted is None:
        wanted = expected_files(fs, root, parts)
        if parts is None:  # the derived tables too (schemas/derived_tables.py)
            wanted += expected_derived_files(fs, root)
    schemas = {"tokens": descriptor.token_schema(), **TABLE_SCHEMAS,
               **{name: schema() for name, schema in DERIVED_SCHEMAS.items()}}
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        checks = list(pool.map(lambda e: _check_file(fs, root, e, schemas, on_bytes), wanted))
    return VerifyReport(checks)


def _check_file(fs: Any, root: str, want: ExpectedFile, schemas: dict[str, Any],
                on_bytes: Callable[[int], None] | None) -> FileCheck:
    def verdict(status: str, detail: str = "", read: int = 0) -> FileCheck:
        return FileCheck(want.part, want.item, want.table, want.path, status, detail,
                         want.source, read)

    path = f"{root}/{want.path}"
    try:
        digest, size, tail = _read_whole(fs, path, on_bytes)
    except FileNotFoundError:
        return verdict(MISSING, "no such file")
    if want.size is not None and size != want.size:
        status = TRUNCATED if size < want.size else SIZE_MISMATCH
        return verdict(status, f"{size} bytes, the manifest records {want.size}", size)
    if want.sha256 is not None and digest != want.sha256:
        return verdict(CORRUPT, f"sha256 {digest[:12]}.. differs from the manifest's "
                                f"{want.sha256[:12]}..", size)
    try:
        metadata = _footer(fs, path, tail, size)
    except (OSError, ValueError) as error:
        return verdict(UNREADABLE, f"no readable Parquet footer ({error})", size)
    if want.rows is not None and metadata.num_rows != want.rows:
        return verdict(ROW_COUNT, f"{metadata.num_rows} rows, the manifest records "
                                  f"{want.rows}", size)
    problem = _schema_problem(metadata.schema.to_arrow_schema(), schemas.get(want.table))
    if problem:
        return verdict(SCHEMA, problem, size)
    return verdict(OK, "" if want.sha256 else "no hash recorded: size, rows, schema only",
                   size)


def _read_whole(fs: Any, path: str, on_bytes: Callable[[int], None] | None
                ) -> tuple[str, int, bytes]:
    """sha256 and size of a file, read once, and its last ``FOOTER_TAIL`` bytes."""
    digest = hashlib.sha256()
    size = 0
    tail = b""
    with fs.open(path, "rb", block_size=READ_BYTES) as handle:
        while chunk := handle.read(READ_BYTES):
            digest.update(chunk)
            size += len(chunk)
            tail = (tail + chunk)[-FOOTER_TAIL:]
            if on_bytes is not None:
                on_bytes(len(chunk))
    return digest.hexdigest(), size, tail


def _footer(fs: Any, path: str, tail: bytes, size: int) -> Any:
    """The Parquet footer, from the file's tail when it holds all of it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if len(tail) >= 8 and tail[-4:] == b"PAR1":
        length = int.from_bytes(tail[-8:-4], "little")
        if length + 8 <= len(tail):
            return pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-(length + 8):]))
    if size < 12:
        raise ValueError(f"{size} bytes is too short for Parquet")
    with fs.open(path, "rb") as handle:
        return pq.read_metadata(io.BytesIO(handle.read()))


def _type_name(kind: Any) -> str:
    """A type as text, without the names Parquet writers give list elements (``item``,
    ``element``): those differ between writers, not in what is stored."""
    import pyarrow as pa

    if pa.types.is_fixed_size_list(kind):
        return f"fixed_size_list<{_type_name(kind.value_type)}>[{kind.list_size}]"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{_type_name(kind.value_type)}>"
    return str(kind)


def _schema_problem(found: Any, expected: Any) -> str | None:
    """Column names and types that differ (nullability and metadata are not compared)."""
    if expected is None:
        return None
    got = {f.name: _type_name(f.type) for f in found}
    want = {f.name: _type_name(f.type) for f in expected}
    if list(got.items()) == list(want.items()):
        return None
    missing = [n for n in want if n not in got]
    other = [f"{n} is {t}, not {want[n]}" for n, t in got.items() if n in want and want[n] != t]
    extra = [n for n in got if n not in want]
    parts = ([f"missing {', '.join(missing)}"] if missing else []) + other + (
        [f"unexpected {', '.join(extra)}"] if extra else [])
    return "; ".join(parts) or "columns in another order"


class VerifiedFiles:
    """File versions found intact before (keys from ``version_keys``) and when, kept as a
    JSON object in ``cache_dir()``. A version checked longer than ``recheck_after_s`` ago
    counts as unknown (read again). A cache that cannot be read starts empty; one that
    cannot be written is not kept (the checks themselves are unaffected)."""

    def __init__(self, path: Path | None = None,
                 recheck_after_s: float = RECHECK_AFTER_S) -> None:
        self.path = path or cache_dir() / VERIFIED_FILE
        self.recheck_after_s = recheck_after_s
        stored = load_json(self.path)
        stored = stored if isinstance(stored, dict) else {}  # a list: an older cache
        self.keys: dict[str, float] = {k: float(t) for k, t in stored.items()
                                       if isinstance(k, str) and isinstance(t, int | float)}

    def __contains__(self, key: str | None) -> bool:
        return key is not None and key in self.keys and \
            time.time() - self.keys[key] < self.recheck_after_s

    def remember(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if not keys:
            return
        now = time.time()
        for key in keys:
            self.keys.pop(key, None)
            self.keys[key] = now  # newest last, so the oldest are dropped first
        save_json(self.path, dict(list(self.keys.items())[-VERIFIED_MAX:]))


def version_keys(fs: Any, root: str, wanted: list[ExpectedFile]) -> dict[str, str]:
    """Path -> a key naming this version of the file: where it is, its recorded hash, and
    the size and change time (or ETag) one listing per table folder reports. Files the
    listing does not show, or shows without a change time, get no key (always read)."""
    protocol = protocols(fs)[0]
    listed: dict[str, dict] = {}
    for table in sorted({w.path.split("/", 1)[0] for w in wanted}):
        try:
            found = fs.find(f"{root}/{table}", detail=True)
        except (FileNotFoundError, OSError):
            continue
        listed.update({fs._strip_protocol(name): info for name, info in found.items()})
    keys = {}
    for want in wanted:
        full = fs._strip_protocol(f"{root}/{want.path}")
        changed = listed_version(listed.get(full))
        if changed is not None:
            version = [protocol, full, want.sha256, want.size, changed]
            keys[want.path] = hashlib.sha256(json.dumps(version).encode()).hexdigest()
    return keys


def require_intact(uri: str, storage_options: dict | None = None, *,
                   remember: bool = True, known: VerifiedFiles | None = None) -> VerifyReport:
    """Verify a dataset for readers that cannot check page CRCs themselves (DuckDB); raise
    an ``ElmoUserError`` naming the first damaged committed file and the fix. ``remember``:
    skip the file versions found intact before, and remember the ones found intact now
    (see the module's docstring); False reads every file. The report lists the files
    read; damaged derived files are in its ``derived_problems`` (not raised: a query of
    another table is unaffected, and ``sql.connect`` makes their view say what is wrong).
    ``known``: the cache to use (a server keeps one open rather than read it per query)."""
    ds = open_dataset(uri, storage_options)
    wanted = expected_files(ds.fs, ds.root) + expected_derived_files(ds.fs, ds.root)
    if remember:
        known = known if known is not None else VerifiedFiles()
        keys = version_keys(ds.fs, ds.root, wanted)
        wanted = [w for w in wanted if keys.get(w.path) not in known]
    report = verify_dataset(ds.fs, ds.root, ds.descriptor, wanted=wanted)
    if remember:
        known.remember(keys[c.path] for c in report.files if c.ok and c.path in keys)
    if report.core_problems:
        raise ElmoUserError(
            f"{uri}: {len(report.core_problems)} damaged file(s), first "
            f"{report.core_problems[0].line()}; rerun its `elmo embed` with --repair")
    return report
