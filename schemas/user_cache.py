"""The per-user cache folder, and how a store's listing names one version of a file.

Everything kept here is a shortcut that a listing validates: an entry is keyed by a file's
version as the store lists it (its size and every change time or ETag the listing gives),
so a rewritten file is a new version and is read again. A cache file that cannot be read
is started again, and one that cannot be written is not kept: results never depend on it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from schemas.files import write_whole

CACHE_ENV = "ELMO_STORE_CACHE"  # the per-user cache folder (default ~/.cache/elmo-store)
# What a listing says of when a file last changed: local and most stores, S3, GCS/Azure.
# Locally also ``created`` (fsspec's name for st_ctime, the inode's change time: any write
# or utime sets it to now, and no call sets it back) and the inode: a byte rewritten in
# place with the modification time put back is a new version.
VERSION_FIELDS = ("mtime", "created", "ino", "LastModified", "ETag", "updated",
                  "last_modified", "etag")


def cache_dir() -> Path:
    """The per-user cache folder: ``$ELMO_STORE_CACHE``, else ``$XDG_CACHE_HOME/elmo-store``,
    else ``~/.cache/elmo-store``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "elmo-store"


def listed_version(info: Mapping[str, Any] | None) -> str | None:
    """One file's version as a listing entry (fsspec ``ls``/``find`` detail) describes it:
    its size and every change time or ETag given (S3 gives both: a second-resolution time
    alone would miss a rewrite within the second). None when the entry gives no change
    time: such a file cannot be recognised again and is always read."""
    if not info:
        return None
    changed = [str(info[f]) for f in VERSION_FIELDS if info.get(f)]
    return json.dumps([info.get("size"), *changed]) if changed else None


def load_json(path: Path) -> Any | None:
    """A cache file's JSON, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def save_json(path: Path, value: Any) -> None:
    """Write a cache file whole (readers see the old or the new one); not kept on error."""
    data = json.dumps(value).encode()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, lambda tmp: tmp.write_bytes(data))
