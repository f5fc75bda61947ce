"""A compact sense index's IVF, stored in shards and opened without its vectors.

One shard per dataset tokens file the index holds (``IndexMeta.indexed``: part, shard, run
id), in a folder of its own under ``_ivf/``; one training folder beside them (the
projection, coarse centroids and product quantizer every shard was encoded with, as one
faiss index: ``projection``; and the sketches' planes):

- ``vectors.npy``: the rows' mixed vectors as int8 (``[n, dim]``, each row scaled by its
  own largest value: a cosine needs no scale), read a row at a time: a query's re-rank
  reads only its candidates' rows;
- ``codes.npy`` ``[n, code bytes]`` and ``lists.npy`` ``[n]``: each row's product-quantized
  code of its projected vector and its list (at most ``CODE_BYTES`` bytes a row: two
  projected values a byte);
- ``sketch.npy`` ``[n, 16]``: each row's 128-bit sketch (``ivf_search.Sketch``);
- ``rows.arrow``: the LanceDB rows of that file in the same order (an Arrow IPC file,
  memory-mapped: a result takes its columns from there), ``row`` ascending;
- ``sentences.arrow``: their sentences' ``doc_id, sent_idx, text`` (Arrow IPC), so that a
  search needs no LanceDB; older shards lack it (their texts come from the table).

What a process holds per row is the code, faiss's 8-byte id and, where the build found the
lists need them (``ivf_search.sketches_needed``), the sketch: at most
``MEMORY_BYTES_PER_ROW`` (88) bytes, 40 at 2.1M rows of the wide model (32-byte codes, no
sketches); the rest stays on disk, in the page cache.
A row's position is its shard's first position plus its place in the shard; a LanceDB
row (a filtered search) finds its position by its key (``part``, ``shard``, ``row``).

A process opens the training and the shards' small files, and loads the codes the first
time a search needs the lists (a filtered search of few rows ranks them exactly from the
vectors and never loads them). ``ivf_shards_build`` makes the shards.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.ivf_search import (
    CANDIDATES_PER_RESULT,
    IVF_DIR,
    IdSketch,
    MemoryIvf,
    Sketch,
    add_to_lists,
    size_lists,
    sketches_needed,
)
from pipeline.lookup.index.projection import inverted
from pipeline.lookup.index.row_vectors import (  # VECTORS_FILE: re-exported
    COPY_FILES,
    IN_PLACE_FILES,
    VECTORS_FILE,  # noqa: F401
)
from pipeline.lookup.index.shard_files import ShardRows, ShardVectors

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

# IndexMeta.ivf["format"] of an IVF in shards: 3, int8 vectors. Earlier generations (1: no
# vectors, re-read from the dataset; 2: float16 vectors) are refused at open with the
# build that makes the index again (``SenseIndex``), not searched on a path of their own.
SHARDS_FORMAT = 3
OLD_COMPACT_FORMATS = (1, 2)
TRAIN_FILE = "trained.faiss"
PLANES_FILE = "sketch_planes.npz"
CODES_FILE = "codes.npy"
LISTS_FILE = "lists.npy"
SKETCH_FILE = "sketch.npy"
ROWS_FILE = "rows.arrow"
SENTENCES_FILE = "sentences.arrow"
# Every shard's files; beside them its vectors' (``row_vectors``): a copy, or in place.
SHARD_FILES = (CODES_FILE, LISTS_FILE, SKETCH_FILE, ROWS_FILE)
VECTOR_FILES = (*COPY_FILES, *IN_PLACE_FILES)
TRAIN_FILES = (TRAIN_FILE, PLANES_FILE)
# Bytes of product-quantized code a row, at most (residuals of the coarse centroid, two
# projected values a byte: ``ivf_shards_build.codes_for``): what a process holds per row,
# with faiss's id and the sketch. Rougher than the vectors: a query takes more candidates
# from the lists to re-rank, as many as the build measured it needs (``CANDIDATE_STEPS``:
# the first whose probes reach recall@10 0.97 on held rows; records without the figure
# take ``SHARD_CANDIDATES_PER_RESULT``).
CODE_BYTES = 64
SHARD_CANDIDATES_PER_RESULT = 30
CANDIDATE_STEPS = (10, 20, 30, 60, 120, 240)
# Per row in a process, at most: the code, faiss's id, the sketch.
MEMORY_BYTES_PER_ROW = CODE_BYTES + 8 + 16


def is_sharded(record: dict[str, Any] | None) -> bool:
    return record is not None and record.get("format") == SHARDS_FORMAT


def projected(record: dict[str, Any]) -> bool:
    """Whether the codes of ``record``'s IVF were made in its rows' principal directions
    (``projection``; builds since 2026-11-29). A training without is made again by the
    next build, which keeps the shards' rows and vectors."""
    return "projected_dim" in record


def candidates_of(record: dict[str, Any]) -> int:
    """Candidates a result a search of ``record``'s IVF takes from its lists."""
    return int(record.get("candidates") or (
        SHARD_CANDIDATES_PER_RESULT if record["codes"] != "SQ8" else CANDIDATES_PER_RESULT))


def as_shard_vectors(vectors: np.ndarray) -> np.ndarray:
    """Mixed vectors as a shard stores them: int8, each row scaled to its largest value.
    Cosines from them are the floats' to within 0.5/127 of a value; the scale (which a
    cosine does not use) is not kept."""
    from schemas.layers import quantize_int8

    return quantize_int8(vectors)[0]


def shard_missing(fs: Any, base: str, shard: dict[str, Any]) -> str | None:
    """The first file of ``shard`` (a record of ``ivf["shards"]``) missing in its folder
    under ``base`` (the index's ``_ivf``), or None."""
    folder = f"{base}/{shard['folder']}"
    for name in SHARD_FILES:
        if not fs.exists(f"{folder}/{name}"):
            return name
    vectors = IN_PLACE_FILES if fs.exists(f"{folder}/{IN_PLACE_FILES[1]}") else COPY_FILES
    for name in vectors:
        if not fs.exists(f"{folder}/{name}"):
            return name
    return None


class ShardedIvf(MemoryIvf):
    """A compact index's IVF in shards (``load``): the search of ``MemoryIvf`` over codes
    loaded on first use, vectors read by row, rows from mapped files."""

    def __init__(self, folder: str, record: dict[str, Any], folders: Sequence[str],
                 nprobe: int) -> None:

        self.record, self.folder, self.nprobe = record, folder, nprobe
        self.rebuild = "`elmo index build`"  # the command that makes it again (``load``)
        shards = record["shards"]
        self.keys = list(shards)
        rows = [int(shards[k]["rows"]) for k in self.keys]
        self.dim = int(record["dim"])
        self.vectors = ShardVectors.of_folders(folders, rows, self.dim)
        self.offsets = self.vectors.offsets
        self.rows = ShardRows([f"{f}/{ROWS_FILE}" for f in folders], self.offsets)
        self.folders = list(folders)
        self.candidates = candidates_of(record)
        self.scan_sketches = sketches_needed(record)
        self.lists = int(record["lists"])  # known before the codes load
        self._index: Any = None
        self._sketch: Sketch | None = None
        self._shard_of = {_pair(key): i for i, key in enumerate(self.keys)}
        self._view: tuple[np.ndarray, MemoryIvf] | None = None  # view_of's last

    @classmethod
    def load(cls, fs: Any, root: str, record: dict[str, Any], rebuild: str,
             cache: str | None = None) -> ShardedIvf:
        """The IVF ``record`` (``IndexMeta.ivf``) describes, its folders under
        ``root/_ivf``; a folder missing or damaged is an error naming the shard and
        ``rebuild`` (the command that makes it again). On an object store the folders are
        copied to ``cache`` (a local folder) first, or to a temporary folder removed with
        the IVF."""
        from schemas.dataset import is_local

        base = f"{root}/{IVF_DIR}"
        if is_local(fs):
            return cls.from_folders(base, record, rebuild)
        import shutil
        import weakref

        copy = _local_copy(fs, base, record, cache)
        try:
            ivf = cls.from_folders(copy, record, rebuild)
        except BaseException:
            if cache is None:
                shutil.rmtree(copy, ignore_errors=True)
            raise
        if cache is None:
            # A temporary copy (the vectors: GBs) goes when the IVF does, or at exit; its
            # mapped files stay readable until then.
            weakref.finalize(ivf, shutil.rmtree, copy, True)
        return ivf

    @classmethod
    def from_folders(cls, base: str, record: dict[str, Any], rebuild: str) -> ShardedIvf:
        """``load`` of the folders under ``base``, a local ``_ivf`` folder."""
        for key, shard in record["shards"].items():
            gone = shard_missing(local_fs(), base, shard)
            if gone is not None:
                raise ElmoUserError(f"index shard {key} ({IVF_DIR}/{shard['folder']}) lacks "
                                    f"{gone}; {rebuild} makes it again")
        try:
            ivf = cls(f"{base}/{record['train']}", record,
                      [f"{base}/{s['folder']}" for s in record["shards"].values()],
                      int(record["nprobe"]))
            ivf.rebuild = rebuild
            return ivf
        except (OSError, ValueError) as error:
            raise ElmoUserError(f"an index shard is unreadable ({error}); {rebuild} makes "
                                "it again") from error

    @property
    def index(self) -> Any:  # type: ignore[override]
        if self._index is None:
            self._index = self._load_codes()
            return_freed_heap()
        return self._index

    @property
    def sketch(self) -> Sketch:  # type: ignore[override]
        if self._sketch is None:
            import numpy as np

            planes, mean = self._planes()
            codes = np.concatenate([np.load(f"{f}/{SKETCH_FILE}") for f in self.folders]) \
                if self.folders else np.zeros((0, planes.shape[1] // 8), np.uint8)
            self._sketch = Sketch(planes, mean, codes)
            del codes
            return_freed_heap()
        return self._sketch

    def _planes(self) -> tuple[np.ndarray, np.ndarray]:
        """The sketches' hyperplanes and the mean they are taken around."""
        import numpy as np

        with np.load(f"{self.folder}/{PLANES_FILE}") as stored:
            return stored["planes"], stored["mean"]

    def _load_codes(self) -> Any:
        """The trained IVF with every shard's codes put in its lists (no encoding)."""
        return self._index_of([(s, None) for s in range(len(self.folders))])

    def _index_of(self, picks: Sequence[tuple[int, np.ndarray | None]]) -> Any:
        """The trained IVF with the codes of each pick's rows put in its lists: shard
        ``s``'s rows at ``local`` positions (every row for ``None``), under their
        whole-index positions."""
        import faiss
        import numpy as np

        index = faiss.read_index(f"{self.folder}/{TRAIN_FILE}")
        lists_index = inverted(index)
        shards = []
        sizes = np.zeros(lists_index.nlist, np.int64)
        for s, local in picks:
            lists = np.load(f"{self.folders[s]}/{LISTS_FILE}", mmap_mode="r")
            codes = np.load(f"{self.folders[s]}/{CODES_FILE}", mmap_mode="r")
            if len(lists) != len(codes) or codes.shape[1:] != (lists_index.code_size,) \
                    or len(lists) != self.offsets[s + 1] - self.offsets[s]:
                raise ElmoUserError(f"index shard {self.keys[s]} does not match its record "
                                    "(a build stopped half way?); `elmo index build` makes "
                                    "it again")
            if local is None:
                local = np.arange(len(lists))
            sizes += np.bincount(np.asarray(lists[local]), minlength=lists_index.nlist)
            shards.append((s, local, lists, codes))
        # Every list at its final size first: lists grown shard by shard doubled their
        # capacity, up to twice the codes' and ids' bytes.
        filled = size_lists(index, sizes)
        total = 0
        for s, local, lists, codes in shards:
            add_to_lists(index, np.asarray(lists[local]), np.asarray(codes[local]),
                         local + self.offsets[s], filled)
            total += len(local)
        index.ntotal = lists_index.ntotal = total  # the projection's and its IVF's
        lists_index.parallel_mode = 1
        return index

    def search(self, queries: np.ndarray, k: int, nprobe: int | None = None,
               leave_out: np.ndarray | None = None, among: np.ndarray | None = None,
               sketched: Sequence[np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """``MemoryIvf.search``; a filtered one (``among``) before the codes are loaded (a
        CLI search of a word) searches an IVF of only those rows' codes and sketches, read
        from the mapped files: what it costs then follows the filter's rows, not the
        index's (loading every code was 0.65 of a CLI search's 6.6 CPU seconds at 0.85M
        rows, and grows with them). The answer is the same: the same lists, the same rows."""
        import numpy as np

        if among is None or self._index is not None:
            return super().search(queries, k, nprobe, leave_out, among, sketched)
        return self.view_of(np.asarray(among, np.int64)).search(
            queries, k, nprobe or self.nprobe, leave_out)

    def prepare_filter(self, among: np.ndarray) -> None:
        """Make now what a search among ``among`` will use: the IVF of only those rows
        while the codes are not loaded (``view_of``), nothing once they are."""
        if self._index is None:
            self.view_of(among)

    def view_of(self, among: np.ndarray) -> MemoryIvf:
        """The IVF of only the rows at ``among``: made once for the last ``among`` asked."""
        import numpy as np
        import pyarrow as pa

        if self._view is not None and np.array_equal(self._view[0], among):
            return self._view[1]

        shard = np.searchsorted(self.offsets, among, side="right") - 1
        picks = [(int(s), among[shard == s] - self.offsets[s]) for s in np.unique(shard)]
        index = self._index_of(picks)
        sketches = np.concatenate(
            [np.load(f"{self.folders[s]}/{SKETCH_FILE}", mmap_mode="r")[local]
             for s, local in picks])
        ids = np.concatenate([local + self.offsets[s] for s, local in picks])
        planes, mean = self._planes()
        # Its search only: no rows to take; as many candidates as this index re-ranks.
        view = MemoryIvf(index, self.vectors, IdSketch(planes, mean, sketches, ids),
                         pa.table({}), self.nprobe)
        view.candidates, view.scan_sketches = self.candidates, self.scan_sketches
        self._view = (among, view)
        return view

    def holds(self, columns: Sequence[str]) -> bool:
        return set(columns) <= set(self.rows.column_names)

    def take_rows(self, columns: Sequence[str], positions: np.ndarray) -> pa.Table:
        return self.rows.take(columns, positions)

    def held_mask(self, keys: pa.Table) -> list[bool]:
        """Whether each of ``keys``' rows (``part``, ``shard``) is of a file this IVF holds."""
        return [(p, int(s)) in self._shard_of for p, s in
                zip(keys.column("part").to_pylist(), keys.column("shard").to_pylist(),
                    strict=True)]

    def positions_of_keys(self, keys: pa.Table) -> np.ndarray:
        """Positions, ascending, of the rows whose ``part``, ``shard`` and ``row`` are
        ``keys``' (rows of the LanceDB table). A row of a file this IVF does not hold, or
        not in its shard's rows, is an error naming the shard and the build that makes it
        again: a search would otherwise leave it out without a word."""
        import numpy as np

        parts = keys.column("part").to_pylist()
        shards = keys.column("shard").to_numpy()
        rows = keys.column("row").to_numpy()
        found = np.full(len(rows), -1, np.int64)
        which = np.array([self._shard_of.get((p, int(s)), -1)
                          for p, s in zip(parts, shards, strict=True)], np.int64)
        for s in np.unique(which[which >= 0]):
            mine = which == s
            held = self.rows.row_column(int(s))
            at = np.minimum(np.searchsorted(held, rows[mine]), max(0, len(held) - 1))
            ok = held[at] == rows[mine] if len(held) else np.zeros(int(mine.sum()), bool)
            found[np.flatnonzero(mine)[ok]] = at[ok] + self.offsets[s]
        if (found < 0).any():
            first = int(np.flatnonzero(found < 0)[0])
            shard = f"{parts[first]}/shard={int(shards[first])}"
            why = "holds no such file" if which[first] < 0 else \
                f"lacks its row {int(rows[first])}"
            raise ElmoUserError(f"index shard {shard} is missing or stale (the IVF {why}, "
                                f"which the index's table has); {self.rebuild} makes it "
                                "again")
        return np.sort(found)


def _pair(key: str) -> tuple[str, int]:
    part, shard, _ = key.split("/")
    return part, int(shard.split("=", 1)[1])


def local_fs() -> Any:
    from fsspec.implementations.local import LocalFileSystem

    return LocalFileSystem()


def _local_copy(fs: Any, base: str, record: dict[str, Any], cache: str | None) -> str:
    """The IVF's folders under ``base`` on ``fs``, copied to a local folder (once: a folder's
    name is unique to what it holds); that folder."""
    import tempfile

    local = cache or tempfile.mkdtemp(prefix="elmo-ivf-")
    wanted = [(record["train"], TRAIN_FILES)] + \
        [(s["folder"], (*SHARD_FILES, *VECTOR_FILES, SENTENCES_FILE))
         for s in record["shards"].values()]
    for folder, files in wanted:
        os.makedirs(f"{local}/{folder}", exist_ok=True)
        for name in files:
            target = f"{local}/{folder}/{name}"
            if not os.path.exists(target):
                try:
                    fs.get_file(f"{base}/{folder}/{name}", target + ".part")
                except FileNotFoundError:
                    continue  # named by load as missing
                os.replace(target + ".part", target)
    return local


def return_freed_heap() -> None:
    """Give glibc's and Arrow's freed heap back to the kernel. Loading the codes and
    sketches reads each shard's arrays and copies them into faiss, and glibc keeps the
    freed copies for reuse: ~16 bytes a row of a searching process that nothing reuses
    (123 -> 107 B a row between 0.85M and 2.1M rows; BENCHMARKS.md, "issue 46 at 2.1M
    rows"). A build's shards leave the largest file's rows in Arrow's pool."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its allocator decides
        ctypes.CDLL("libc.so.6").malloc_trim(0)
