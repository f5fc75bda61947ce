"""One writer per dataset: the ``_lock`` file (docs/dataset_format.md, "Writers").

Both writers of a dataset, ``elmo embed`` and the jobs runner, hold it while they change
the manifest; readers never take it. The derived tables' registry has its own lock file
(``_derived.lock``, schemas/derived_tables.py), held for the moments a registry update
takes: its writers wait their turn (``wait_s``) instead of failing.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from elmo_model.errors import ElmoUserError
from schemas.files import is_local, read_json, write_bytes_atomic

LOCK_FILE = "_lock"
DEFAULT_STALE_AFTER_S = 15 * 60.0
HEARTBEAT_EVERY_S = 30.0
WAIT_POLL_S = 0.05  # how often a waiting writer looks again


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

    def __init__(self, fs: Any, root: str, stale_after_s: float = DEFAULT_STALE_AFTER_S,
                 name: str = LOCK_FILE, wait_s: float = 0.0) -> None:
        """``name``: the lock file under ``root``; ``wait_s``: how long ``acquire`` waits
        for a live owner to let go (0: fail at once, as two runs into one ``--out`` do)."""
        self.fs, self.root, self.stale_after_s = fs, root, stale_after_s
        self.wait_s = wait_s
        self.path = f"{root}/{name}"
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
            try:
                with open(draft, "wb") as handle:  # on a full disk too: never left behind
                    handle.write(self._record())
                os.link(draft, self.path)
            except FileExistsError:
                return False
            finally:
                with contextlib.suppress(FileNotFoundError):
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
        deadline = time.monotonic() + self.wait_s
        takeovers = 0
        while takeovers < 3:
            if self._create_exclusive():
                self._thread = threading.Thread(target=self._beat, daemon=True)
                self._thread.start()
                return
            owner = read_json(self.fs, self.path)
            if owner is None:
                continue  # released between our two looks: try again
            reason = self._stale_reason(owner)
            if reason is None and time.monotonic() < deadline:
                time.sleep(WAIT_POLL_S)
                continue
            if reason is None:
                raise ElmoUserError(
                    f"{self.root} is being written by another run (pid {owner.get('pid')} on "
                    f"{owner.get('host')}); wait for it, or delete {self.path} if it is dead"
                )
            takeovers += 1
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
