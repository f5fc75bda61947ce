"""The on-disk dataset: descriptor, writer lock, per-shard commits and the manifest.

Exactly-once rests on three rules (see ``docs/dataset_format.md``):

1. A shard's (work item's) files are written under ``_staging/<run_id>/<attempt>/`` and
   moved to their final names only when complete, so a final name never holds a
   partial file.
2. After the moves, ``_manifest/<part>/shard=<k>.json`` is written (temp name + move).
   A shard is committed if and only if that entry exists.
3. A run recomputes every uncommitted shard from scratch, first deleting whatever a
   crashed run may have moved into place, so no row is ever stored twice.

Workers write only under staging; the driver alone moves files into place and writes
the manifest (pipeline/write/commit.py), which is what makes these rules enough, on local
disks and on object stores alike.

What readers read is the *live view* (``schemas.dataset.list_files``): the
shards listed by ``_live.json`` when a writer that swaps parts (jobs) has published one
(``publish_live``), else every committed shard. Every reader in this project goes
through it; the file is plain JSON so that readers without our code can do the same
(docs/dataset_format.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from elmo_model.errors import ElmoUserError
from schemas import DESCRIPTOR_FILE, PARTITION_COLUMN, TABLES, DatasetDescriptor

# Opening a location and reading the manifest and live view are the read path's
# (schemas/dataset.py); the write path's callers import them from here too.
from schemas.dataset import (
    LIVE_FILE,
    LIVE_FORMAT,
    LIVE_VERSION,
    MANIFEST_DIR,
    committed_shards,
    is_local,
    iter_parts,
    read_json,
    shard_from_entry,
    write_bytes_atomic,
)
from schemas.dataset import live_parts as live_parts
from schemas.dataset import open_fs as open_fs
from schemas.dataset import read_live as read_live

LOCK_FILE = "_lock"
STAGING_DIR = "_staging"
PLAN_FILE = "plan.json"
DEFAULT_STALE_AFTER_S = 15 * 60.0
HEARTBEAT_EVERY_S = 30.0


# A work item's files live in ``shard=<item>`` folders: the public layout's name for them.
def table_file(root: str, table: str, item: int, part: str) -> str:
    return f"{root}/{table}/{PARTITION_COLUMN}={item}/{part}.parquet"


def manifest_path(root: str, part: str, item: int) -> str:
    return f"{root}/{MANIFEST_DIR}/{part}/{PARTITION_COLUMN}={item}.json"


# --------------------------------------------------------------------------- descriptor


def has_committed_data(fs: Any, root: str) -> bool:
    """Whether any part of the dataset has a committed shard (readers could see data)."""
    return any(committed_shards(fs, root, part) for part in iter_parts(fs, root))


def check_output_dir(fs: Any, root: str) -> None:
    """Refuse to write a dataset into a directory that holds something else."""
    if fs.isfile(root):
        raise ElmoUserError(f"--out {root} is a file; give a directory for the dataset")
    if not fs.isdir(root) or read_json(fs, f"{root}/{DESCRIPTOR_FILE}") is not None:
        return
    names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)]
    # Names starting with "_" are ours: a lock or a live view left before any commit.
    foreign = sorted(n for n in names if not n.startswith("_"))
    if foreign:
        raise ElmoUserError(f"--out {root} is not empty and not an elmo-store dataset (it "
                            f"holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}"
                            "); give a new or empty directory")


def ensure_descriptor(fs: Any, root: str, wanted: DatasetDescriptor) -> bool:
    """Create the descriptor, or check that the existing one agrees with ``wanted``.
    Returns True when this call wrote it (the caller may undo that on failure).

    A descriptor with no committed data behind it (a run that failed or was killed
    before its first commit) is replaced: nothing was made with its settings.
    """
    path = f"{root}/{DESCRIPTOR_FILE}"
    existing = read_json(fs, path)
    if existing is None:
        if fs.exists(root) and any(
            fs.exists(f"{root}/{t}") for t in TABLES
        ):
            raise ElmoUserError(f"{root} holds tables but no {DESCRIPTOR_FILE}; "
                                "refusing to write into a directory that is not our dataset")
        write_bytes_atomic(fs, path, wanted.to_json().encode())
        return True
    try:
        current = DatasetDescriptor.from_json(json.dumps(existing))
    except (ValueError, TypeError) as error:
        raise ElmoUserError(f"{path}: not a readable elmo-store descriptor ({error})") from None
    problems = current.incompatibilities(wanted)
    if not problems:
        return False
    if not has_committed_data(fs, root):
        write_bytes_atomic(fs, path, wanted.to_json().encode())
        return True
    if current.schema_version < wanted.schema_version:
        raise ElmoUserError(
            f"{root} is an elmo-store dataset of schema version {current.schema_version}; "
            f"this release writes version {wanted.schema_version} "
            "(docs/dataset_format.md) and cannot add to it: write to a new --out (old "
            "datasets stay readable), or re-embed the corpus there")
    raise ElmoUserError(
        f"refusing to write into {root}: it was made with different settings "
        f"({'; '.join(problems)}); choose another --out or the same model/settings"
    )


# --------------------------------------------------------------------------- lock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed child that its parent has not reaped yet is a zombie: dead for our purpose.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as handle:
        if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


class DatasetLock:
    """One writer per dataset: ``_lock`` holds the owner's host, pid and a heartbeat.

    A lock is stale (and taken over) when its owner was on this host and that process is
    gone, or when its heartbeat is older than ``stale_after_s`` (owners on other hosts).
    A live owner's heartbeat is refreshed by a background thread.
    """

    def __init__(self, fs: Any, root: str, stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
        self.fs, self.root, self.stale_after_s = fs, root, stale_after_s
        self.path = f"{root}/{LOCK_FILE}"
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self) -> bytes:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": self.token,
                           "heartbeat": time.time()}).encode()

    def _create_exclusive(self) -> bool:
        if is_local(self.fs):
            os.makedirs(self.root, exist_ok=True)
            # The record is complete before the lock exists: link() publishes a written
            # file atomically and fails if the lock is there. (O_EXCL creates an empty file
            # first, which a competing run could read before the record was in it.)
            draft = f"{self.path}.{self.token}.tmp"
            with open(draft, "wb") as handle:
                handle.write(self._record())
            try:
                os.link(draft, self.path)
            except FileExistsError:
                return False
            finally:
                os.unlink(draft)
            return True
        # Object stores have no O_EXCL here: write, then read back to see who won.
        if self.fs.exists(self.path):
            return False
        write_bytes_atomic(self.fs, self.path, self._record())
        time.sleep(0.05)
        owner = read_json(self.fs, self.path) or {}
        return owner.get("token") == self.token

    def _stale_reason(self, owner: dict) -> str | None:
        age = time.time() - float(owner.get("heartbeat", 0))
        if owner.get("host") == socket.gethostname() and not _pid_alive(int(owner.get("pid", -1))):
            return f"process {owner.get('pid')} is gone"
        if age > self.stale_after_s:
            return f"no heartbeat for {age:.0f} s"
        return None

    def acquire(self) -> None:
        for _ in range(3):
            if self._create_exclusive():
                self._thread = threading.Thread(target=self._beat, daemon=True)
                self._thread.start()
                return
            owner = read_json(self.fs, self.path)
            if owner is None:
                continue  # released between our two looks: try again
            reason = self._stale_reason(owner)
            if reason is None:
                raise ElmoUserError(
                    f"{self.root} is being written by another run (pid {owner.get('pid')} on "
                    f"{owner.get('host')}); wait for it, or delete {self.path} if it is dead"
                )
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self.path)
        raise ElmoUserError(f"could not take the lock {self.path}; try again")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_EVERY_S):
            with contextlib.suppress(Exception):
                write_bytes_atomic(self.fs, self.path, self._record())

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        owner = read_json(self.fs, self.path) or {}
        if owner.get("token") == self.token:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self.path)

    def __enter__(self) -> DatasetLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# --------------------------------------------------------------------------- manifest


def sum_counts(entries: Iterable[dict]) -> dict[str, int]:
    """The manifest entries' ``counts`` summed by key (an entry without counts adds
    nothing; a key missing from some entries is summed over the others)."""
    totals: dict[str, int] = {}
    for entry in entries:
        for key, value in entry.get("counts", {}).items():
            totals[key] = totals.get(key, 0) + int(value)
    return totals


class PlanMismatchError(ElmoUserError):
    """A part already exists, made from other inputs or options than this run's."""

    def __init__(self, message: str, part: str) -> None:
        super().__init__(message)
        self.part = part


def check_plan(fs: Any, root: str, part: str, plan: dict) -> bool:
    """Record what a part is made from; a resumed run must be made from the same inputs.
    Returns True when this call wrote the record."""
    path = f"{root}/{MANIFEST_DIR}/{part}/{PLAN_FILE}"
    existing = read_json(fs, path)
    if existing is None or (existing != plan and not committed_shards(fs, root, part)):
        # (Nothing committed from a recorded plan: a run failed or was killed before its
        # first commit, and the new plan replaces it.)
        write_bytes_atomic(fs, path, json.dumps(plan, indent=1, sort_keys=True).encode())
        return True
    if existing != plan:
        changed = sorted(k for k in set(existing) | set(plan) if existing.get(k) != plan.get(k))
        raise PlanMismatchError(
            f"{root} already holds part {part!r} made from other inputs or options "
            f"(differs in: {', '.join(changed)}); write to a new --out (or a new --part)",
            part,
        )
    return False


def clear_staging(fs: Any, root: str, run_id: str | None = None) -> None:
    """Remove staging left by dead runs and uncommitted attempts (only called while
    holding the lock): all of it, or one run's."""
    path = f"{root}/{STAGING_DIR}" + (f"/{run_id}" if run_id else "")
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path, recursive=True)
    if run_id:  # the staging folder itself goes when no other run's is in it
        with contextlib.suppress(FileNotFoundError, OSError):
            remove_if_empty(fs, f"{root}/{STAGING_DIR}")


def remove_if_empty(fs: Any, path: str) -> None:
    """Remove the folder ``path`` when it exists and holds nothing. Errors (a race with
    another writer, say) are the caller's to handle."""
    if fs.exists(path) and not fs.ls(path, detail=False):
        fs.rm(path, recursive=True)


# --------------------------------------------------------------------------- writing a part


@dataclass
class PartWrite:
    """One run's write of a part: what it created, so a run that fails before its first
    commit can leave the output as it found it (``abandon_part``)."""

    part: str
    root_existed: bool
    descriptor: bool = False  # this run wrote the descriptor
    plan: bool = False  # this run wrote the part's plan record
    commits: int = 0  # items this run committed
    resumed: dict[int, dict] = field(default_factory=dict)  # committed by earlier runs


def begin_part(fs: Any, root: str, write: PartWrite, descriptor: DatasetDescriptor,
               plan: dict) -> None:
    """Under the dataset lock: record the descriptor and the part's plan (refusing a
    dataset or part made otherwise), drop dead runs' staging and note what earlier runs
    committed (``write.resumed``)."""
    write.descriptor = ensure_descriptor(fs, root, descriptor)
    write.plan = check_plan(fs, root, write.part, plan)
    clear_staging(fs, root)  # attempts of dead runs: never committed, never will be
    write.resumed = committed_shards(fs, root, write.part)


def abandon_part(fs: Any, root: str, write: PartWrite) -> None:
    """After a failed run: undo what ``write`` created, unless anything of the part is
    committed (then the next run resumes it)."""
    if write.commits or committed_shards(fs, root, write.part):
        return
    with contextlib.suppress(FileNotFoundError):
        if write.plan:
            fs.rm(f"{root}/{MANIFEST_DIR}/{write.part}/{PLAN_FILE}")
            for folder in (f"{root}/{MANIFEST_DIR}/{write.part}", f"{root}/{MANIFEST_DIR}"):
                remove_if_empty(fs, folder)
        if write.descriptor and not has_committed_data(fs, root):
            fs.rm(f"{root}/{DESCRIPTOR_FILE}")
    with contextlib.suppress(FileNotFoundError, OSError):
        if not write.root_existed:
            remove_if_empty(fs, root)


def uncommit_items(fs: Any, root: str, part: str, entries: dict[int, dict]) -> None:
    """Under the dataset lock: make items uncommitted again (damaged ones a repair run
    re-embeds). The manifest entry goes first, since it is the commit point; the files
    after it are then leftovers that the item's next commit replaces anyway."""
    for item, entry in sorted(entries.items()):
        with contextlib.suppress(FileNotFoundError):
            fs.rm(manifest_path(root, part, item))
        for rel in shard_from_entry(entry, part, item).files.values():
            with contextlib.suppress(FileNotFoundError):
                fs.rm(f"{root}/{rel}")


def live_counts(fs: Any, root: str) -> dict[str, int]:
    """Row counts of the live view (what readers see), from the manifest."""
    return sum_counts(entry for part in live_parts(fs, root)
                      for entry in committed_shards(fs, root, part).values())


# --------------------------------------------------------------------------- live view


def publish_live(fs: Any, root: str, parts: set[str] | list[str]) -> dict:
    """Make ``parts`` (and nothing else) the live view, in one atomic write.

    Every shard of every listed part must be committed already: the file names the
    shards as they are now, so what it lists never changes under a reader. Callers hold
    the dataset's writer lock or their own (jobs hold the job lock).
    """
    shards = []
    for part in sorted(set(parts)):
        for shard, entry in sorted(committed_shards(fs, root, part).items()):
            s = shard_from_entry(entry, part, shard)
            shards.append({"part": s.part, "shard": s.shard, "run_id": s.run_id,
                           "files": dict(sorted(s.files.items()))})
    previous = read_json(fs, f"{root}/{LIVE_FILE}") or {}
    data = {"format": LIVE_FORMAT, "version": LIVE_VERSION,
            "generation": int(previous.get("generation", 0)) + 1,
            "updated_at": time.time(), "parts": sorted(set(parts)), "shards": shards}
    write_bytes_atomic(fs, f"{root}/{LIVE_FILE}", json.dumps(data, indent=1).encode())
    return data
