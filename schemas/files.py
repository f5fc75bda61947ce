"""Where a dataset lives: opening a URI, reading JSON, writing a file whole.

The bottom of the storage contract: every reader and writer in this project opens a
location through ``open_fs`` and replaces a small file (a manifest entry, the live view,
a cache entry, a checkpoint) through ``write_bytes_atomic`` / ``write_whole``, so a
reader sees the old file or the new one, never half of one. Paths below are paths of
``fs`` (no protocol).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


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
    """A JSON file's value, or None when the file does not exist."""
    try:
        with fs.open(path, "rb") as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        return None


def temp_name(path: str) -> str:
    """A sibling name for a file being written: unique per write, ending in ``.tmp``."""
    return f"{path}.{uuid.uuid4().hex[:8]}.tmp"


def write_whole(path: str | Path, write: Callable[[Path], None]) -> Path:
    """A local file written whole: ``write`` fills a temporary sibling, which is synced
    to disk and then renamed over ``path`` (a crash leaves the old file or the new one,
    never half of one). The temporary file is gone afterwards, whatever happened."""
    path = Path(path)
    tmp = Path(temp_name(str(path)))
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


def write_bytes_atomic(fs: Any, path: str, data: bytes) -> None:
    """``data`` into ``path`` on any file system: readers see all of it or none.
    Local files go through ``write_whole``; on an object store, where an upload appears
    whole or not at all, a temporary sibling is moved into place."""
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    if is_local(fs):
        write_whole(path, lambda tmp: tmp.write_bytes(data))
        return
    tmp = temp_name(path)
    with fs.open(tmp, "wb") as handle:
        handle.write(data)
    fs.mv(tmp, path)
