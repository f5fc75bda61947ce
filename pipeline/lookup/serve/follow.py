"""A served index that follows its builds: each request looks at the index's
``_elmo_index.json`` (one stat of a local file; on an object store at most once a
second), and when a build has published a new one, the new version is opened beside the
requests and swapped in whole once it is ready. Until then, and for the requests under way
at the swap, the version opened before answers: a build keeps the version it replaces on
disk until the next build (``pipeline/lookup/index/publish.py``), so they finish on it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from pipeline.lookup.index.meta import INDEX_META
from schemas.files import is_local, open_fs

if TYPE_CHECKING:
    from pipeline.lookup.index.sense_index import SenseIndex

# Between two looks at an object store's JSON (each is a request to the store).
REMOTE_CHECK_S = 1.0


class FollowedIndex:
    """The ``SenseIndex`` at ``uri`` as last published: ``get()`` per request.
    ``open_index``: how the server opens (and warms) an index; ``follow``: False keeps the
    version opened first (an index whose shards Ray actors hold)."""

    def __init__(self, uri: str, open_index: Callable[[str], SenseIndex],
                 follow: bool = True) -> None:
        self.uri, self._open, self.follow = uri, open_index, follow
        self._fs, root = open_fs(uri)
        self._path = f"{root}/{INDEX_META}"
        self._local = is_local(self._fs)
        self._stamp = self._published()
        self._current = open_index(uri)
        self.generation = 0  # how many new versions were swapped in
        self._lock = threading.Lock()
        self._loading = False
        self._refused: Hashable = None  # a version that could not be opened
        self._looked = time.monotonic()

    def get(self) -> SenseIndex:
        """The index to answer this request from (starting to open a newer one if a build
        published one since the last look)."""
        if self.follow and not self._loading:
            now = time.monotonic()
            if self._local or now - self._looked >= REMOTE_CHECK_S:
                self._looked = now
                stamp = self._published()
                if stamp is not None and stamp not in (self._stamp, self._refused):
                    self._start_loading(stamp)
        return self._current

    def _published(self) -> Hashable:
        """What tells one published JSON from the next (None: none there now). A build
        replaces the file whole (a rename), so its inode changes with every commit."""
        try:
            if self._local:
                st = os.stat(self._path)
                return (st.st_ino, st.st_mtime_ns, st.st_size)
            info = self._fs.info(self._path)
            return tuple(sorted((k, str(v)) for k, v in info.items()))
        except (FileNotFoundError, OSError):
            return None

    def _start_loading(self, stamp: Hashable) -> None:
        with self._lock:
            if self._loading:
                return
            self._loading = True
        threading.Thread(target=self._load, args=(stamp,), name="elmo-index-follow",
                         daemon=True).start()

    def _load(self, stamp: Hashable) -> None:
        try:
            index = self._open(self.uri)
        except Exception as error:  # a bad build must not take the served version down
            self._refused = stamp
            print(f"elmo serve: {self.uri} was rebuilt but cannot be opened "
                  f"({' '.join(str(error).split())[:300]}); still answering from the "
                  "version opened before", file=sys.stderr, flush=True)
        else:
            self._current, self._stamp = index, stamp
            self.generation += 1
            print(f"elmo serve: {self.uri}: now answering from its new build "
                  f"({index.meta.rows} rows)", file=sys.stderr, flush=True)
        finally:
            self._loading = False
