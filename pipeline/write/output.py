"""The output dataset as the write path prepares it: checks before writing, the descriptor,
a part's plan record, staging, and undoing a run that failed before its first commit.

Exactly-once rests on three rules (see ``docs/dataset_format.md``):

1. A work item's files are written under ``_staging/<run_id>/<attempt>/`` and moved to
   their final names (``<table>/shard=<item>/<part>.parquet``) only when complete, so a
   final name never holds a partial file.
2. After the moves, the item's commit record ``_manifest/<part>/shard=<item>.json`` is
   written (``schemas.manifest``). An item is committed if and only if that record exists.
3. A run recomputes every uncommitted item from scratch, first deleting whatever a
   crashed run may have moved into place, so no row is ever stored twice.

Workers write only under staging; the driver alone moves files into place and writes
the manifest (pipeline/write/commit.py), holding the dataset's lock
(``schemas.lock.DatasetLock``), which is what makes these rules enough, on local disks
and on object stores alike.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elmo_model.errors import ElmoUserError, SettingError
from schemas.files import read_json, write_bytes_atomic
from schemas.layout import DESCRIPTOR_FILE, TABLES
from schemas.manifest import (
    MANIFEST_DIR,
    committed_items,
    iter_parts,
    manifest_path,
    shard_from_entry,
)
from schemas.tables import DatasetDescriptor

STAGING_DIR = "_staging"
PLAN_FILE = "plan.json"


# --------------------------------------------------------------------------- descriptor


def has_committed_data(fs: Any, root: str) -> bool:
    """Whether any part of the dataset has a committed work item (readers could see data)."""
    return any(committed_items(fs, root, part) for part in iter_parts(fs, root))


def check_output_dir(fs: Any, root: str) -> None:
    """Refuse to write a dataset into a directory that holds something else."""
    if fs.isfile(root):
        raise SettingError("out", lambda name: (
            f"{name('out')} {root} is a file; give a directory for the dataset"))
    if not fs.isdir(root) or read_json(fs, f"{root}/{DESCRIPTOR_FILE}") is not None:
        return
    names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)]
    # Names starting with "_" are ours: a lock or a live view left before any commit.
    foreign = sorted(n for n in names if not n.startswith("_"))
    if foreign:
        held = f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}"
        raise SettingError("out", lambda name: (
            f"{name('out')} {root} is not empty and not an elmo-store dataset (it holds "
            f"{held}); give a new or empty directory"))


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
        raise SettingError("out", lambda name: (
            f"{root} is an elmo-store dataset of schema version {current.schema_version}; "
            f"this release writes version {wanted.schema_version} (docs/dataset_format.md) "
            f"and cannot add to it: write to a new {name('out')} (old datasets stay "
            "readable), or re-embed the corpus there"))
    raise SettingError("out", lambda name: (
        f"refusing to write into {root}: it was made with different settings "
        f"({'; '.join(current.incompatibilities(wanted, name))}); choose another "
        f"{name('out')} or the same model/settings"))


# --------------------------------------------------------------------------- manifest


class PlanMismatchError(SettingError):
    """A part already exists, made from other inputs or options than this run's."""

    def __init__(self, render: Callable[[Callable[[str], str]], str], part: str) -> None:
        super().__init__("part", render)
        self.part = part


def check_plan(fs: Any, root: str, part: str, plan: dict) -> bool:
    """Record what a part is made from; a resumed run must be made from the same inputs.
    Returns True when this call wrote the record."""
    path = f"{root}/{MANIFEST_DIR}/{part}/{PLAN_FILE}"
    existing = read_json(fs, path)
    if existing is None or (existing != plan and not committed_items(fs, root, part)):
        # (Nothing committed from a recorded plan: a run failed or was killed before its
        # first commit, and the new plan replaces it.)
        write_bytes_atomic(fs, path, json.dumps(plan, indent=1, sort_keys=True).encode())
        return True
    if existing != plan:
        changed = sorted(k for k in set(existing) | set(plan) if existing.get(k) != plan.get(k))
        raise PlanMismatchError(lambda name: (
            f"{root} already holds part {part!r} made from other inputs or options "
            f"(differs in: {', '.join(changed)}); write to a new {name('out')} (or a new "
            f"{name('part')})"), part)
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
    write.resumed = committed_items(fs, root, write.part)


def abandon_part(fs: Any, root: str, write: PartWrite) -> None:
    """After a failed run: undo what ``write`` created, unless anything of the part is
    committed (then the next run resumes it)."""
    if write.commits or committed_items(fs, root, write.part):
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
