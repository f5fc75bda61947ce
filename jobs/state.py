"""Job state kept with the output dataset, under ``<output>/_jobs/``.

    _jobs/_lock              one run of a job at a time (pipeline.write.output.DatasetLock format)
    _jobs/state.json         per source file: fingerprint and the dataset *part* holding
                             its rows; the set of those parts is the dataset's live view
    _jobs/history/<id>.json  one record per run (start, end, files, counts, status)

Why parts: the pipeline stores each part (``--part``) with its own manifest entries, so a
source file embedded into its own part can be added, replaced or removed without touching
the rows of any other file. A changed file is embedded into a *new* part (the name holds a
digest of its content), and ``state.json`` is switched from the old part to the new one by
one atomic write: a reader of the live view sees the old rows or the new rows, never both.
Readers do not read this file: every run publishes the same set of parts as the
dataset's ``_live.json`` (``pipeline.write.output.publish_live``), which every reader of the
dataset follows. Parts outside the live view (old versions, or a crashed run's
unfinished work) are deleted later; a plain directory scan of ``tokens/`` can see them
until then (see docs/dataset_format.md, "Live view").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from elmo_model.errors import ElmoUserError
from schemas.files import open_fs, read_json, write_bytes_atomic
from schemas.lock import DatasetLock
from schemas.manifest import list_files

JOBS_DIR = "_jobs"
STATE_FILE = "state.json"
HISTORY_DIR = "history"
STATE_VERSION = 1
PART_PREFIX = "f-"


def jobs_root(root: str) -> str:
    return f"{root}/{JOBS_DIR}"


class JobBusyError(ElmoUserError):
    """Another run of the same job holds its lock (a scheduler skips; a user is told)."""


# --------------------------------------------------------------------------- fingerprints


@dataclass
class FileRecord:
    """What the job knows about one source file and where its rows are."""

    uri: str
    size: int
    version: str  # mtime or etag, as fsspec reports it
    sha256: str | None  # content hash, when the file was small enough to hash cheaply
    part: str
    documents: int = 0
    tokens: int = 0
    errors: int = 0


def content_digest(fs: Any, path: str, size: int, version: str, max_bytes: int
                   ) -> str | None:
    """sha256 of the file when it is at most ``max_bytes`` (reading it is then cheap next
    to embedding it); None otherwise, and size + mtime/etag alone decide."""
    if size > max_bytes:
        return None
    digest = hashlib.sha256()
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def part_name(uri: str, size: int, version: str, sha256: str | None) -> str:
    """Deterministic: the same file content always lands in the same part, so a clean run
    and a resumed one write the same paths, and a crashed run's part is resumed."""
    key = hashlib.sha256(uri.encode()).hexdigest()[:12]
    content = sha256 or hashlib.sha256(f"{size}:{version}".encode()).hexdigest()
    return f"{PART_PREFIX}{key}-{content[:12]}"


# --------------------------------------------------------------------------- state


@dataclass
class JobState:
    job: str
    files: dict[str, FileRecord] = field(default_factory=dict)  # by source URI
    generation: int = 0  # bumped by every state switch
    updated_at: float = 0.0

    @property
    def live_parts(self) -> set[str]:
        return {record.part for record in self.files.values()}

    def to_json(self) -> bytes:
        data = {"version": STATE_VERSION, "job": self.job, "generation": self.generation,
                "updated_at": self.updated_at,
                "files": {uri: vars(rec) for uri, rec in sorted(self.files.items())}}
        return json.dumps(data, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: dict, where: str) -> JobState:
        if data.get("version") != STATE_VERSION:
            raise ElmoUserError(f"{where}: job state version {data.get('version')!r} is not "
                                f"{STATE_VERSION}; written by another elmo-store release")
        return cls(job=str(data.get("job", "")), generation=int(data.get("generation", 0)),
                   updated_at=float(data.get("updated_at", 0.0)),
                   files={uri: FileRecord(**rec) for uri, rec in data["files"].items()})


def read_state(fs: Any, root: str, job: str) -> JobState:
    path = f"{jobs_root(root)}/{STATE_FILE}"
    data = read_json(fs, path)
    if data is None:
        return JobState(job=job)
    state = JobState.from_json(data, path)
    if state.job and state.job != job:
        raise ElmoUserError(f"{root} belongs to job {state.job!r}, not {job!r}; two jobs "
                            "must not share an output (give this one its own output)")
    return state


def write_state(fs: Any, root: str, state: JobState) -> None:
    """The commit point of a run: one atomic replace of ``state.json``."""
    state.generation += 1
    state.updated_at = time.time()
    write_bytes_atomic(fs, f"{jobs_root(root)}/{STATE_FILE}", state.to_json())


# --------------------------------------------------------------------------- live view


def live_files(uri: str, table: str = "tokens", storage_options: dict | None = None
               ) -> list[str]:
    """URIs of the live files of one table (``schemas.manifest.list_files``): the
    jobs API's view of what readers read."""
    fs, root = open_fs(uri, storage_options)
    return [fs.unstrip_protocol(f.path) for f in list_files(fs, root, table)]


# --------------------------------------------------------------------------- history


@dataclass
class RunRecord:
    run_id: str
    job: str
    trigger: str  # manual | schedule | submit
    started_at: float
    slot: float | None = None  # the cron slot a scheduled run serves (epoch seconds)
    ended_at: float | None = None
    status: str = "running"  # running | ok | no-changes | failed | crashed
    files: dict[str, int] = field(default_factory=dict)  # new/changed/deleted/...
    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    errors: int = 0
    message: str = ""
    index: dict[str, str] = field(default_factory=dict)  # mix -> result
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)

    @classmethod
    def start(cls, job: str, trigger: str, slot: float | None, now: float) -> RunRecord:
        # Microseconds: runs a moment apart (a no-change run takes well under a second)
        # must still sort in start order by name.
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1e6) % 10**6:06d}Z"
        return cls(run_id=f"{stamp}-{uuid.uuid4().hex[:8]}", job=job, trigger=trigger,
                   started_at=now, slot=slot)

    @property
    def duration_s(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.started_at


def write_run(fs: Any, root: str, record: RunRecord) -> None:
    # One file per run: appending is not possible on object stores, and a per-run file
    # is rewritten atomically when the run ends.
    path = f"{jobs_root(root)}/{HISTORY_DIR}/{record.run_id}.json"
    write_bytes_atomic(fs, path, json.dumps(vars(record), indent=1, sort_keys=True).encode())


def iter_runs(fs: Any, root: str) -> Iterator[RunRecord]:
    """Run records, oldest first (run ids start with their UTC start time)."""
    try:
        names = sorted(fs.ls(f"{jobs_root(root)}/{HISTORY_DIR}", detail=False))
    except FileNotFoundError:
        return
    known = set(RunRecord.__dataclass_fields__)
    records = []
    for name in names:
        if not name.endswith(".json"):
            continue
        data = read_json(fs, name)
        if data is not None:
            records.append(RunRecord(**{k: v for k, v in data.items() if k in known}))
    yield from sorted(records, key=lambda r: (r.started_at, r.run_id))


def mark_crashed_runs(fs: Any, root: str, now: float) -> list[str]:
    """Runs still "running" while we hold the job lock died without finishing."""
    crashed = []
    for record in iter_runs(fs, root):
        if record.status == "running":
            record.status, record.ended_at = "crashed", None
            found = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(now))
            record.message = f"found unfinished at {found}; its work is resumed by this run"
            write_run(fs, root, record)
            crashed.append(record.run_id)
    return crashed


# --------------------------------------------------------------------------- lock


@contextlib.contextmanager
def job_lock(fs: Any, root: str) -> Iterator[None]:
    """Hold the job's lock; ElmoUserError when another live run holds it.

    Reuses the pipeline's lock (an atomic create locally, heartbeat, stale detection by pid
    on this host or by heartbeat age elsewhere), on a file of its own: the pipeline takes
    the dataset's ``_lock`` per embedding call, the job holds this one for a whole run.
    """
    lock = DatasetLock(fs, jobs_root(root))
    try:
        lock.acquire()
    except ElmoUserError as error:
        raise JobBusyError(str(error).replace("is being written by another run",
                                         "is in use by another run of this job")) from None
    try:
        yield
    finally:
        lock.release()
