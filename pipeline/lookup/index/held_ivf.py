"""The sense index's vectors as an IVF index held in the serving process: the fast path of a
search without a prefilter.

LanceDB's IVF_HNSW_SQ query costs 12-13 ms at 1M x 1024 on this 2-core machine at recall@10
0.94-0.95, about 0.75 ms for each partition it probes; this one answers the same queries in
about 3 ms at 0.98 (BENCHMARKS.md, "The 5 ms target met").

``elmo index build`` makes it after the LanceDB table (``finish_index``), from the table's
own rows in one scan, into a folder of its own beside the table (``_ivf/<name>/``), which
``_elmo_index.json`` then names (``IndexMeta.held``: that write is the commit):

- ``ivf.faiss``: ``IndexIVFScalarQuantizer``, round(sqrt(n)) lists, 8-bit codes, inner
  product over unit vectors (cosine);
- ``vectors.npy``: the vectors as the table stores them (float16 or float32, n x dim), to
  re-rank the candidates by: distances are then LanceDB's own to within float32 rounding;
- ``sketch.npz``: a 128-bit sketch of every row (the signs of its centred vector's
  projections on 128 random directions: ``planes``, ``mean``, ``codes``);
- ``rows.parquet``: the table's other columns in the same order (row i is faiss id i).

A query takes candidates from two places, and the exact cosine of their stored vectors
ranks them: the rows of the lists it probes, and the rows whose sketches differ from its
own in the fewest bits (a scan of every sketch, 16 bytes a row: about 1 ms per million).
The lists find the neighbours that sit in a cluster; the sketches find those of a word with
few uses, whose rows lie far from every list's centre and so in lists nobody would probe
(on bench/lookup.py's 1M x 1024 vectors, 16 probes found 0.92 of the exact 10 alone, 0.96
with the sketches).

How many lists a query probes is measured at build time, not assumed, because it depends on
the data: the rule below chose 12 of 1,000 lists for one synthetic set, 192 of 316 for
another and 3 of 319 for the `make run` index. ``CALIBRATION_QUERIES`` stored rows are
searched, each with itself left out, against their exact 10 nearest among all rows; the
index keeps the fewest probes in ``PROBE_STEPS`` whose mean recall@10 reaches
``CALIBRATION_RECALL``, or after which twice the probes gain less than
``CALIBRATION_PLATEAU`` (the recall it reached is recorded either way). Queries that are
new contexts of stored words measure close to these (BENCHMARKS.md).

An index whose table has changed since its IVF was made (a build that stopped half way)
keeps answering from LanceDB: the table version the IVF was made from must be the table's.

A compact index (``elmo index build --compact``, ``index_vectors``) keeps no vectors in its
table and none in this folder: its lists hold product-quantized codes (``PQ_DIMS_PER_BYTE``
dimensions a byte, from ``PQ_MIN_ROWS`` rows; 8-bit scalar codes below that, where the
bytes do not matter), the re-rank takes the vectors mixed from the dataset when the index
is opened, ``rows.parquet`` has LanceDB's ``_rowid`` of each row (a filtered search asks
LanceDB for the row ids that pass, then ranks up to ``EXACT_FILTER_ROWS`` of them exactly
and searches more through the lists and sketches restricted to them), and it answers
every search, filtered or not (BENCHMARKS.md, "Compact indexes").
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

HELD_DIR = "_ivf"
# What a folder holds; an index whose IVF is of another format has it made again.
HELD_FORMAT = 1
IVF_FILE = "ivf.faiss"
SKETCH_FILE = "sketch.npz"
SKETCH_BITS = 128  # faiss scans binary codes of up to 32 bytes with its fast kernels
VECTORS_FILE = "vectors.npy"
ROWS_FILE = "rows.parquet"
FILES = (IVF_FILE, VECTORS_FILE, SKETCH_FILE, ROWS_FILE)
# Candidates per result taken from each source (the lists, the sketches), then ranked by
# exact cosine: 10 found no more of the exact 10 than 5 at 1M x 1024.
CANDIDATES_PER_RESULT = 5
# ... from lists of product-quantized codes, whose order is rougher (compact indexes).
PQ_CANDIDATES_PER_RESULT = 10
CALIBRATION_QUERIES = 500
# Above the 0.95 promised: a mean over 500 queries is good to about +-0.005, and queries
# that are new sentences can differ from stored rows.
CALIBRATION_RECALL = 0.97
# ... or the fewest probes after which twice as many gain less than this (some neighbours
# are found by no number of probes: then more probes only cost time).
CALIBRATION_PLATEAU = 0.002
CALIBRATION_K = 10
PROBE_STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
               1024, 1536, 2048)
# k-means on at most this many rows per list (faiss wants at least 39).
TRAIN_ROWS_PER_LIST = 64
READ_BATCH_ROWS = 65_536
# Compact indexes: product quantization of this many dimensions per 8-bit code, once the
# table has enough rows to train 256 centroids per sub-vector (faiss asks 39 per centroid).
# Two dimensions a byte found what 8-bit scalar codes (one a byte) find; four lost a fifth
# of the neighbours at 1M x 1024 (BENCHMARKS.md, "Compact indexes").
PQ_DIMS_PER_BYTE = 2
PQ_MIN_ROWS = 39 * 256
# Each sub-vector's 256 centroids are trained on this many points per centroid, 10 rounds:
# faiss's defaults (256 points, 25 rounds) took 6x as long at the same recall.
PQ_TRAIN_POINTS_PER_CENTROID = 40
PQ_TRAIN_ROUNDS = 10
ROW_ID = "_rowid"  # LanceDB's row id, kept per row by compact indexes
# A compact index's filtered search ranks up to this many rows exactly; a filter leaving
# more is searched through the lists and sketches, restricted to its rows: an exact scan
# of 95k rows at 1024-d took 0.2 s.
EXACT_FILTER_ROWS = 20_000
RANK_BLOCK_ROWS = 8_192  # rows widened to float32 at a time: they stay in cache
# A rebuild after the table changed keeps the coarse centroids and codebooks it was trained
# with while the rows stay within this factor of those it was trained on; LanceDB's own
# vector index is kept by the same rule (index_build). Training was 62 of the 140 s that
# a 1M x 1024 compact index's codes took (BENCHMARKS.md).
RETRAIN_GROWTH = 4


def current(held: dict[str, Any] | None, table_version: int) -> bool:
    """Whether ``held`` (``IndexMeta.held``) describes an IVF of this format made from the
    table at ``table_version``."""
    return held is not None and held.get("format") == HELD_FORMAT \
        and held.get("table_version") == table_version


def held_files(held: dict[str, Any]) -> tuple[str, ...]:
    """The files of ``held``'s folder (a compact index's has no vectors file)."""
    return tuple(f for f in FILES if not (f == VECTORS_FILE and from_dataset(held)))


def from_dataset(held: dict[str, Any]) -> bool:
    """Whether ``held`` re-ranks with vectors read from the dataset (a compact index)."""
    return held.get("vectors") == "dataset"


def present(fs: Any, root: str, held: dict[str, Any] | None) -> bool:
    """Whether every file of ``held``'s folder exists under ``root``."""
    return held is not None and all(
        fs.exists(f"{root}/{HELD_DIR}/{held['folder']}/{name}") for name in held_files(held))


def list_count(rows: int) -> int:
    return max(1, round(rows ** 0.5))


def probe_steps(lists: int) -> list[int]:
    return [p for p in PROBE_STEPS if p < lists] + [lists]


class HeldIvf:
    """An IVF index of a sense index's rows, loaded: ``search`` returns row positions."""

    def __init__(self, index: Any, vectors: np.ndarray, sketch: Sketch, rows: pa.Table,
                 nprobe: int) -> None:
        self.index, self.vectors, self.sketch = index, vectors, sketch
        # A query's probed lists are scanned on every core (1.05 ms against 2.3 ms on one
        # for 12 lists at 1M x 1024); queries come one at a time (``search``).
        self.index.parallel_mode = 1
        # One chunk: taking 10 rows from a chunked table costs 0.8 ms, from one 0.02 ms.
        self.rows = rows.combine_chunks()
        self.nprobe = nprobe
        self.dim = vectors.shape[1]
        self.candidates = PQ_CANDIDATES_PER_RESULT if hasattr(index, "pq") \
            else CANDIDATES_PER_RESULT
        self._row_order: np.ndarray | None = None  # positions by row id (positions_of)
        self._sorted_ids: np.ndarray | None = None

    @classmethod
    def load(cls, fs: Any, folder: str, nprobe: int,
             vectors_of: Callable[[pa.Table], np.ndarray] | None = None) -> HeldIvf:
        """The IVF in ``folder``; ``vectors_of``: a compact index's vectors for its rows
        (``index_vectors.read_index_vectors``), instead of the folder's vectors file."""
        import io

        import numpy as np
        import pyarrow.parquet as pq

        from schemas.dataset import is_local

        local = is_local(fs)
        index = read_ivf(fs, f"{folder}/{IVF_FILE}")
        with np.load(io.BytesIO(fs.cat(f"{folder}/{SKETCH_FILE}"))) as stored:
            sketch = Sketch(stored["planes"], stored["mean"], stored["codes"])
        with fs.open(f"{folder}/{ROWS_FILE}", "rb") as handle:
            rows = pq.read_table(handle)
        if vectors_of is not None:
            vectors = vectors_of(rows)
        elif local:
            # Mapped, not read: the page cache holds what re-ranks touch, shared by processes.
            vectors = np.load(f"{folder}/{VECTORS_FILE}", mmap_mode="r")
        else:
            vectors = np.load(io.BytesIO(fs.cat(f"{folder}/{VECTORS_FILE}")))
        if len(vectors) != index.ntotal or len(rows) != index.ntotal:
            raise ValueError(f"{folder}: {index.ntotal} codes, {len(vectors)} vectors and "
                             f"{len(rows)} rows")
        return cls(index, vectors, sketch, rows, nprobe)

    def holds(self, columns: Sequence[str]) -> bool:
        return set(columns) <= set(self.rows.column_names)

    def search(self, queries: np.ndarray, k: int, nprobe: int | None = None,
               leave_out: np.ndarray | None = None, among: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Positions ``[n, k]`` (-1 where fewer rows exist) and cosine similarities of the
        ``k`` rows nearest each of ``queries`` ``[n, dim]``; ``leave_out``: a position per
        query not to return (calibration's own row); ``among``: only these positions (a
        filter: the lists and sketches skip the others).

        One query at a time: a query's answer is then the same alone or in a batch (the
        server's batching promises that), and batches gained nothing here (32 queries in
        one faiss call took longer than 32 calls on 2 cores: BENCHMARKS.md)."""
        import numpy as np

        unit = unit_rows(queries)
        positions = np.full((len(unit), k), -1, np.int64)
        sims = np.full((len(unit), k), -np.inf, np.float32)
        selector = None if among is None else _Selector(among, self.index.ntotal)
        for i in range(len(unit)):
            own = None if leave_out is None else int(leave_out[i])
            found, best = self._search_one(unit[i:i + 1], k, nprobe or self.nprobe, own,
                                           selector)
            positions[i, :found.size], sims[i, :best.size] = found, best
        return positions, sims

    def _search_one(self, unit: np.ndarray, k: int, nprobe: int, leave_out: int | None,
                    selector: _Selector | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``search`` for one unit query ``[1, dim]``: positions and similarities, best
        first, at most ``k``."""
        import faiss
        import numpy as np

        rows = self.index.ntotal if selector is None else selector.rows
        extra = 0 if leave_out is None else 1
        want = min(rows, max(k, self.candidates * k) + extra)
        enough = min(rows, k + extra)
        sel = None if selector is None else selector.faiss
        while True:
            params = faiss.SearchParametersIVF(nprobe=nprobe, sel=sel)
            _, found = self.index.search(unit, want, params=params)
            # The probed lists hold fewer rows than asked for (a large k, or a filter that
            # leaves few in them): probe more.
            if nprobe >= self.index.nlist or int((found >= 0).sum()) >= enough:
                break
            nprobe = min(self.index.nlist, 4 * nprobe)
        # ... and the rows of the nearest sketches; a row found both ways counts once.
        # The sketches give CANDIDATES_PER_RESULT a result whatever the lists' codes: their
        # scan of every row slows with the number it keeps.
        sketched = min(rows, max(k, CANDIDATES_PER_RESULT * k) + extra)
        found = np.unique(np.concatenate([found[0],
                                          self.sketch.nearest(unit, sketched, sel)[0]]))
        found = found[(found >= 0) & (found != (-1 if leave_out is None else leave_out))]
        sims = self.cosines(unit[0], found)
        order = np.argsort(-sims, kind="stable")[:k]
        return found[order], sims[order]

    def cosines(self, unit: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Exact cosine of the stored vectors at ``positions`` to ``unit`` (a unit query):
        every ranking's last step. Many rows (an exact scan) go through torch, which widens
        float16 about 8x as fast as numpy (95k rows at 1024-d: 0.2 s against 1.1 s); a
        query's candidates through numpy, since torch's thread pool and faiss's then wait
        on each other (a query at 1M x 1024 took 8 ms instead of 3)."""
        import numpy as np

        if len(positions) < RANK_BLOCK_ROWS:
            candidates = np.asarray(self.vectors[positions], np.float32)
            return candidates @ unit / np.maximum(np.linalg.norm(candidates, axis=1), 1e-12)
        import torch

        sims = np.empty(len(positions), np.float32)
        query = torch.from_numpy(np.ascontiguousarray(unit, np.float32))
        for start in range(0, len(positions), RANK_BLOCK_ROWS):
            block = torch.from_numpy(np.ascontiguousarray(
                self.vectors[positions[start:start + RANK_BLOCK_ROWS]])).float()
            norms = torch.linalg.vector_norm(block, dim=1).clamp_min(1e-12)
            sims[start:start + RANK_BLOCK_ROWS] = ((block @ query) / norms).numpy()
        return sims

    def take_rows(self, columns: Sequence[str], positions: np.ndarray) -> pa.Table:
        """``columns`` of the rows at ``positions``, in their order."""
        import pyarrow as pa

        return self.rows.select(list(columns)).take(pa.array(positions))

    def positions_of(self, row_ids: np.ndarray) -> np.ndarray:
        """The positions of the rows whose LanceDB row ids are ``row_ids`` (a compact
        index keeps them: ``ROW_ID``), in their order."""
        import numpy as np

        if self._row_order is None:
            ids = self.rows.column(ROW_ID).to_numpy()
            self._row_order = np.argsort(ids, kind="stable")
            self._sorted_ids = ids[self._row_order]
        row_ids = np.asarray(row_ids, np.uint64)
        at = np.searchsorted(self._sorted_ids, row_ids)
        at = np.minimum(at, len(self._sorted_ids) - 1)
        if len(row_ids) and not np.array_equal(self._sorted_ids[at], row_ids):
            raise ValueError("row ids the in-memory IVF does not hold (the table changed)")
        return self._row_order[at]

    def exact(self, queries: np.ndarray, k: int, among: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """``search`` by exact cosine over the rows at positions ``among`` (None: every
        row), scanned in blocks: a filtered search, or one asked to be exact. One query at
        a time, as ``search``: an answer is the same alone or in a batch."""
        import numpy as np

        unit = unit_rows(queries)
        among = np.arange(len(self.vectors)) if among is None else np.asarray(among, np.int64)
        positions = np.full((len(unit), k), -1, np.int64)
        sims = np.full((len(unit), k), -np.inf, np.float32)
        for i in range(len(unit)):
            found, best = self._exact_one(unit[i], k, among)
            positions[i, :found.size], sims[i, :best.size] = found, best
        return positions, sims

    def _exact_one(self, unit: np.ndarray, k: int, among: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        sims = self.cosines(unit, among)
        order = np.argsort(-sims, kind="stable")[:k]
        return among[order], sims[order]

    def nearest_rows(self, queries: np.ndarray, k: int, columns: Sequence[str],
                     among: np.ndarray | None = None, exact: bool = False) -> pa.Table:
        """``columns`` of the ``k`` nearest rows to each query, nearest first, with
        ``_distance`` (1 - cosine, as LanceDB's cosine distance) and, for more than one
        query, ``query_index``: the shape of a LanceDB vector search's answer. ``among``:
        only these positions (up to ``EXACT_FILTER_ROWS`` of them ranked exactly, more
        through the lists and sketches); ``exact``: all of them, or every row, exactly."""
        import numpy as np
        import pyarrow as pa

        from pipeline.lookup.index.vector_search import DISTANCE_COLUMN

        if exact or (among is not None and len(among) <= EXACT_FILTER_ROWS):
            positions, sims = self.exact(queries, k, among)
        else:
            positions, sims = self.search(queries, k, among=among)
        keep = positions >= 0
        taken = self.take_rows(columns, positions[keep])
        taken = taken.append_column(DISTANCE_COLUMN,
                                    pa.array((1.0 - sims[keep]).astype(np.float32)))
        if len(positions) > 1:
            which = np.broadcast_to(np.arange(len(positions))[:, None], positions.shape)
            taken = taken.append_column("query_index", pa.array(which[keep], pa.int32()))
        return taken


class Sketch:
    """Binary sketches of unit vectors: bit j of a row is whether its vector, less the
    rows' mean, points along ``planes[:, j]``; the bits two vectors differ in estimate the
    angle between them (random-hyperplane hashing)."""

    def __init__(self, planes: np.ndarray, mean: np.ndarray, codes: np.ndarray) -> None:
        import faiss

        self.planes, self.mean, self.codes = planes, mean, codes
        self.scan = faiss.IndexBinaryFlat(planes.shape[1])
        self.scan.add(codes)

    @staticmethod
    def planes_for(dim: int) -> np.ndarray:
        import numpy as np

        return np.random.default_rng(0).standard_normal((dim, SKETCH_BITS)).astype(
            np.float32)

    @staticmethod
    def encode(unit: np.ndarray, planes: np.ndarray, mean: np.ndarray) -> np.ndarray:
        import numpy as np

        return np.packbits((unit - mean) @ planes > 0, axis=1)

    def nearest(self, unit: np.ndarray, k: int, sel: Any = None) -> np.ndarray:
        """Positions ``[n, k]`` of the rows whose sketches are nearest each query's
        (``sel``: a faiss ID selector, only those rows)."""
        import faiss

        params = None if sel is None else faiss.SearchParameters(sel=sel)
        _, found = self.scan.search(self.encode(unit, self.planes, self.mean),
                                    min(k, self.scan.ntotal), params=params)
        return found


class _Selector:
    """The rows a filter leaves, as a faiss ID selector (a bitmap of every row)."""

    def __init__(self, among: np.ndarray, total: int) -> None:
        import faiss
        import numpy as np

        mask = np.zeros(total, bool)
        mask[among] = True
        self.rows = int(mask.sum())
        self.bitmap = np.packbits(mask, bitorder="little")  # kept: faiss holds a pointer
        self.faiss = faiss.IDSelectorBitmap(total, faiss.swig_ptr(self.bitmap))


@dataclass(frozen=True)
class HeldSearch:
    """A search ``SenseIndex.vector_query`` sends to the held IVF: the same ``to_arrow`` as
    ``VectorSearch``."""

    ivf: HeldIvf
    vectors: np.ndarray
    k: int
    columns: Sequence[str]
    then: Callable[[pa.Table], pa.Table] | None = None
    # A compact index's filtered search: the positions that passed (ranked exactly).
    among: np.ndarray | None = None
    exact: bool = False

    def to_arrow(self) -> pa.Table:
        found = self.ivf.nearest_rows(self.vectors, self.k, self.columns, self.among,
                                      self.exact)
        return found if self.then is None else self.then(found)


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """``vectors`` (any float type) scaled to unit length, as float32."""
    import numpy as np

    vectors = np.asarray(vectors, np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12))


def codes_for(rows: int, dim: int, compact: bool) -> str:
    """The faiss codes of an IVF's lists: 8-bit scalar codes, or for a compact index of
    enough rows product-quantized codes of ``PQ_DIMS_PER_BYTE`` dimensions a byte."""
    if compact and rows >= PQ_MIN_ROWS and dim % PQ_DIMS_PER_BYTE == 0:
        return f"PQ{dim // PQ_DIMS_PER_BYTE}"
    return "SQ8"


def read_ivf(fs: Any, path: str) -> Any:
    """The faiss index stored at ``path`` on ``fs`` (read in place where it is local)."""
    import faiss
    import numpy as np

    from schemas.dataset import is_local

    if is_local(fs):
        return faiss.read_index(path)
    return faiss.deserialize_index(np.frombuffer(fs.cat(path), np.uint8))


def trained_index(fs: Any, root: str, previous: dict[str, Any] | None, rows: int, dim: int,
                  codes: str) -> Any | None:
    """The IVF of ``previous`` (the ``IndexMeta.held`` being replaced) emptied of its rows but
    keeping its training, when it can serve ``rows`` rows of ``dim`` with ``codes``: the
    same codes, and rows within ``RETRAIN_GROWTH`` times those it was trained on. None
    otherwise (and for records older than ``trained_rows``), or if it cannot be read."""
    if previous is None or previous.get("format") != HELD_FORMAT \
            or previous.get("codes", "SQ8") != codes or not previous.get("trained_rows"):
        return None
    trained = previous["trained_rows"]
    if not trained / RETRAIN_GROWTH <= rows <= trained * RETRAIN_GROWTH:
        return None
    try:
        index = read_ivf(fs, f"{root}/{HELD_DIR}/{previous['folder']}/{IVF_FILE}")
    except (OSError, RuntimeError):
        return None  # gone or unreadable: train anew
    if index.d != dim or index.nlist != previous["lists"] or not index.is_trained:
        return None
    index.reset()
    return index


def build_held(table: Any, fs: Any, root: str, show_progress: bool = False,
               vectors_of: Callable[[pa.Table], np.ndarray] | None = None,
               dim: int | None = None, previous: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """Make the IVF of ``table`` (a LanceDB table with a ``vector`` column) in a new folder
    under ``root/_ivf``; returns what ``IndexMeta.held`` records. The caller commits it by
    writing the metadata, then calls ``drop_other_folders``. A compact index's table has
    no vectors: ``vectors_of`` gives them for its rows (``index_vectors``) and ``dim``
    their size; the folder then keeps each row's ``ROW_ID`` instead of the vectors.
    ``previous``: the record this one replaces, whose training is kept where it fits
    (``trained_index``); every row is encoded again either way."""
    import faiss
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.lookup.index.progress import phase, rows_bar
    from schemas.dataset import is_local

    compact = vectors_of is not None
    version = table.version
    rows = table.count_rows()
    columns = [f.name for f in table.schema if f.name != "vector"]
    if not compact:
        dim = table.schema.field("vector").type.list_size
    assert dim is not None, "a compact index's IVF needs the vectors' size"
    name = f"v{version}-{uuid.uuid4().hex[:8]}"
    local = is_local(fs)
    work = f"{root}/{HELD_DIR}/{name}" if local else tempfile.mkdtemp(prefix="elmo-ivf-")
    os.makedirs(work, exist_ok=True)
    try:
        vectors: Any = None
        if not compact:
            stored_type = np.dtype(
                table.schema.field("vector").type.value_type.to_pandas_dtype())
            vectors = np.lib.format.open_memmap(f"{work}/{VECTORS_FILE}", mode="w+",
                                                dtype=stored_type, shape=(rows, dim))
        pieces = []
        done = 0
        with rows_bar(rows, show_progress) as bar:
            bar.set_description("index: in-memory IVF: read", refresh=False)
            query = table.search().select(columns if compact else [*columns, "vector"])
            if compact:
                query = query.with_row_id(True)
            for batch in query.limit(max(1, rows)).to_batches(batch_size=READ_BATCH_ROWS):
                if not compact:
                    flat = batch.column("vector").flatten().to_numpy(zero_copy_only=False)
                    vectors[done:done + batch.num_rows] = flat.reshape(-1, dim)
                    batch = batch.drop_columns(["vector"])
                # A copy: a slice of the batch would keep its vectors' buffers alive (2 GB
                # held at 1M x 1024).
                pieces.append(pa.Table.from_batches([batch.take(pa.array(
                    np.arange(batch.num_rows)))]))
                done += batch.num_rows
                bar.update(batch.num_rows)
        if done != rows:
            raise RuntimeError(f"read {done} rows of the index table, expected {rows}")
        kept_rows = pa.concat_tables(pieces)
        if compact:
            vectors = vectors_of(kept_rows)
        codes = codes_for(rows, dim, compact)
        rng = np.random.default_rng(0)
        index = trained_index(fs, root, previous, rows, dim, codes)
        if index is not None:
            assert previous is not None
            lists, trained_rows = previous["lists"], previous["trained_rows"]
            doing = f"codes over {rows} rows (training of {trained_rows} rows kept)"
        else:
            lists, trained_rows = list_count(rows), rows
            doing = f"codes over {rows} rows"
        with phase(f"index: in-memory IVF: {lists} lists of {codes} {doing}", show_progress):
            if index is None:
                index = faiss.index_factory(dim, f"IVF{lists},{codes}",
                                            faiss.METRIC_INNER_PRODUCT)
                # Polysemous codes serve Hamming-filtered PQ search, which is not used here;
                # their training was 50 of 65 s on the `make run` index.
                if hasattr(index, "do_polysemous_training"):
                    index.do_polysemous_training = False
                    index.pq.cp.max_points_per_centroid = PQ_TRAIN_POINTS_PER_CENTROID
                    index.pq.cp.niter = PQ_TRAIN_ROUNDS
                # Product quantizers train 256 centroids a sub-vector: at least PQ_MIN_ROWS.
                wanted = TRAIN_ROWS_PER_LIST * lists if codes == "SQ8" \
                    else max(TRAIN_ROWS_PER_LIST * lists, PQ_MIN_ROWS)
                sample = np.sort(rng.choice(rows, min(rows, wanted), replace=False))
                index.cp.min_points_per_centroid = 1  # small tables: no warning on stderr
                index.train(unit_rows(vectors[sample]))
            mean = np.zeros(dim, np.float32)  # of the unit rows: the sketches' centre
            for start in range(0, rows, READ_BATCH_ROWS):
                unit = unit_rows(vectors[start:start + READ_BATCH_ROWS])
                index.add(unit)
                mean += unit.sum(axis=0)
            mean /= max(1, rows)
        with phase(f"index: in-memory IVF: {SKETCH_BITS}-bit sketches", show_progress):
            planes = Sketch.planes_for(dim)
            sketch_codes = np.concatenate([
                Sketch.encode(unit_rows(vectors[start:start + READ_BATCH_ROWS]), planes, mean)
                for start in range(0, rows, READ_BATCH_ROWS)])
            np.savez(f"{work}/{SKETCH_FILE}", planes=planes, mean=mean, codes=sketch_codes)
        held = HeldIvf(index, vectors, Sketch(planes, mean, sketch_codes), kept_rows, lists)
        with phase("index: in-memory IVF: measure probes for recall@10", show_progress):
            nprobe, recall, queries = calibrate(held, rng)
        faiss.write_index(index, f"{work}/{IVF_FILE}")  # no copy in memory
        pq.write_table(held.rows, f"{work}/{ROWS_FILE}", compression="zstd")
        if not compact:
            vectors.flush()
        del held, vectors
        record = {"format": HELD_FORMAT, "folder": name, "table_version": version,
                  "rows": rows, "lists": lists, "nprobe": nprobe,
                  "recall_at_10": round(recall, 4), "calibration_queries": queries,
                  "codes": codes, "trained_rows": trained_rows}
        if compact:
            record |= {"vectors": "dataset"}
        if not local:
            for file in held_files(record):
                fs.put_file(f"{work}/{file}", f"{root}/{HELD_DIR}/{name}/{file}")
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if not local:
        shutil.rmtree(work, ignore_errors=True)
    return record


def calibrate(held: HeldIvf, rng: np.random.Generator) -> tuple[int, float, int]:
    """The fewest probes whose recall@10 reaches CALIBRATION_RECALL on stored rows used as
    queries (each left out of its own answer): ``(nprobe, recall, queries)``."""
    import numpy as np

    rows = len(held.vectors)
    k = min(CALIBRATION_K, rows - 1)
    lists = held.index.nlist
    if k < 1 or lists == 1:
        return lists, 1.0, 0
    picks = np.sort(rng.choice(rows, min(rows, CALIBRATION_QUERIES), replace=False))
    queries = unit_rows(held.vectors[picks])
    truth = exact_nearest(held.vectors, queries, k, picks)

    def recall(nprobe: int) -> float:
        found, _ = held.search(queries, k, nprobe=nprobe, leave_out=picks)
        return float(np.mean([len(set(f) & set(t)) / k for f, t in zip(found, truth,
                                                                       strict=True)]))

    measured: dict[int, float] = {}
    for nprobe in probe_steps(lists):
        measured[nprobe] = recall(nprobe)
        if measured[nprobe] >= CALIBRATION_RECALL:
            return nprobe, measured[nprobe], len(picks)
        twice = min(lists, 2 * nprobe)
        if twice != nprobe:
            measured.setdefault(twice, recall(twice))
            if measured[twice] - measured[nprobe] < CALIBRATION_PLATEAU:
                return nprobe, measured[nprobe], len(picks)
    return lists, measured[lists], len(picks)


def exact_nearest(vectors: np.ndarray, queries: np.ndarray, k: int,
                  leave_out: np.ndarray) -> np.ndarray:
    """Positions of the ``k`` rows of ``vectors`` with the highest cosine to each query
    (unit vectors), ``leave_out[i]`` excluded for query i: a scan in blocks."""
    import numpy as np

    best_sims = np.full((len(queries), k), -np.inf, np.float32)
    best_rows = np.full((len(queries), k), -1, np.int64)
    block = 65_536
    for start in range(0, len(vectors), block):
        part = unit_rows(vectors[start:start + block])
        sims = queries @ part.T
        own = (leave_out >= start) & (leave_out < start + len(part))
        sims[np.flatnonzero(own), leave_out[own] - start] = -np.inf
        both_sims = np.concatenate([best_sims, sims], axis=1)
        both_rows = np.concatenate([best_rows, np.broadcast_to(
            np.arange(start, start + len(part)), sims.shape)], axis=1)
        top = np.argpartition(-both_sims, k - 1, axis=1)[:, :k]
        best_sims = np.take_along_axis(both_sims, top, axis=1)
        best_rows = np.take_along_axis(both_rows, top, axis=1)
    return best_rows


def drop_other_folders(fs: Any, root: str, keep: str | Sequence[str] | None) -> None:
    """Remove IVF folders other than ``keep`` (older builds, or ones a stopped build left)."""
    keep = {keep} if isinstance(keep, str) else set(keep or ())
    base = f"{root}/{HELD_DIR}"
    try:
        names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(base, detail=False)]
    except FileNotFoundError:
        return
    for name in names:
        if name not in keep:
            fs.rm(f"{base}/{name}", recursive=True)
