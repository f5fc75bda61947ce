"""The sense index's IVF held in a searching process (``MemoryIvf``): the fast path of a
search. ``ivf_build`` makes the folder of a full index; ``ivf_shards`` opens a compact
index's IVF in shards through the same search.

A full index's folder (``_ivf/<name>/``, which ``_elmo_index.json`` names in ``ivf``):

- ``ivf.faiss``: ``IndexIVFScalarQuantizer``, round(sqrt(n)) lists, 8-bit codes, inner
  product over unit vectors (cosine);
- ``vectors.npy``: the vectors as the table stores them (float16 or float32, n x dim), to
  re-rank the candidates by: distances are then LanceDB's own to within float32 rounding;
- ``sketch.npz``: a 128-bit sketch of every row (the signs of its centred vector's
  projections on 128 random directions: ``planes``, ``mean``, ``codes``);
- ``rows.parquet``: the table's other columns in the same order (row i is faiss id i).

A query takes candidates from two places, and the exact cosine of their stored vectors
ranks them: the rows of the lists it probes, and the rows whose sketches differ from its
own in the fewest bits (a scan of every sketch, 16 bytes a row). The lists find the
neighbours that sit in a cluster; the sketches find those of a word with few uses, whose
rows lie far from every list's centre and so in lists nobody would probe (BENCHMARKS.md,
"The 5 ms target met"). How many lists a query probes is measured at build time
(``ivf_build.calibrate``).

A full index whose table has changed since its IVF was made (a build that stopped half
way) answers from LanceDB: the table version the IVF was made from must be the table's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.lookup.index.projection import inverted
from pipeline.lookup.layers.vectors import unit_vectors

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

IVF_DIR = "_ivf"
# What a folder holds; an index whose IVF is of another format has it made again.
IVF_FORMAT = 1
IVF_FILE = "ivf.faiss"
SKETCH_FILE = "sketch.npz"
SKETCH_BITS = 128  # faiss scans binary codes of up to 32 bytes with its fast kernels
VECTORS_FILE = "vectors.npy"
ROWS_FILE = "rows.parquet"
FILES = (IVF_FILE, VECTORS_FILE, SKETCH_FILE, ROWS_FILE)
# Candidates per result taken from each source (the lists, the sketches), then ranked by
# exact cosine: 10 found no more of the exact 10 than 5 (BENCHMARKS.md).
CANDIDATES_PER_RESULT = 5
# ... from lists of product-quantized codes, whose order is rougher (compact indexes).
PQ_CANDIDATES_PER_RESULT = 10
READ_BATCH_ROWS = 65_536
# A compact index's filtered search ranks up to this many rows exactly; a filter leaving
# more is searched through the lists and sketches, restricted to its rows (BENCHMARKS.md,
# "Compact indexes": where an exact scan stops paying).
EXACT_FILTER_ROWS = 20_000
RANK_BLOCK_ROWS = 8_192  # rows widened to float32 at a time: they stay in cache


def sketches_needed(record: dict[str, Any]) -> bool:
    """Whether a search of the IVF ``record`` describes takes candidates from the sketches
    as well as the lists: a compact index's build leaves them out where its lists alone
    reached the recall it calibrates to (``ivf_build.calibrate``). Their scan reads every
    row's sketch: 7 of 12 ms a query at 2.1M rows once the codes ranked well (BENCHMARKS.md,
    "issue 46: codes in the rows' principal directions")."""
    return bool(record.get("sketches", True))


def current(ivf: dict[str, Any] | None, table_version: int) -> bool:
    """Whether ``ivf`` (``IndexMeta.ivf``) describes an IVF of this format made from the
    table at ``table_version``."""
    return ivf is not None and ivf.get("format") == IVF_FORMAT \
        and ivf.get("table_version") == table_version


def present(fs: Any, root: str, ivf: dict[str, Any] | None) -> bool:
    """Whether every file of ``ivf``'s folder exists under ``root``."""
    return ivf is not None and all(
        fs.exists(f"{root}/{IVF_DIR}/{ivf['folder']}/{name}") for name in FILES)


class MemoryIvf:
    """An IVF index of a sense index's rows, loaded: ``search`` returns row positions."""

    def __init__(self, index: Any, vectors: np.ndarray, sketch: Sketch, rows: pa.Table,
                 nprobe: int) -> None:
        self.index, self.vectors, self.sketch = index, vectors, sketch
        # A query's probed lists are scanned on every core; queries come one at a time
        # (``search``; BENCHMARKS.md, "Where the milliseconds went").
        lists_index = inverted(index)
        lists_index.parallel_mode = 1
        self.lists = lists_index.nlist
        # One chunk: taking rows from a chunked table costs many times more.
        self.rows = rows.combine_chunks()
        self.nprobe = nprobe
        self.dim = vectors.shape[1]
        self.candidates = PQ_CANDIDATES_PER_RESULT if hasattr(lists_index, "pq") \
            else CANDIDATES_PER_RESULT
        self.scan_sketches = True  # ``sketches_needed``

    @classmethod
    def load(cls, fs: Any, folder: str, nprobe: int) -> MemoryIvf:
        """The IVF in ``folder`` (a full index's)."""
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
        if local:
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
               leave_out: np.ndarray | None = None, among: np.ndarray | None = None,
               sketched: Sequence[np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Positions ``[n, k]`` (-1 where fewer rows exist) and cosine similarities of the
        ``k`` rows nearest each of ``queries`` ``[n, dim]``; ``leave_out``: a position per
        query not to return (calibration's own row); ``among``: only these positions (a
        filter: the lists and sketches skip the others); ``sketched``: each query's sketch
        candidates from ``sketch_candidates`` (no filter), not scanned again.

        One query at a time: a query's answer is then the same alone or in a batch (the
        server's batching promises that), and batches gained nothing here (32 queries in
        one faiss call took longer than 32 calls on 2 cores: BENCHMARKS.md)."""
        import numpy as np

        unit = unit_vectors(queries)
        positions = np.full((len(unit), k), -1, np.int64)
        sims = np.full((len(unit), k), -np.inf, np.float32)
        selector = None if among is None else _Selector(among, self.index.ntotal)
        for i in range(len(unit)):
            own = None if leave_out is None else int(leave_out[i])
            found, best = self._search_one(unit[i:i + 1], k, nprobe or self.nprobe, own,
                                           selector, None if sketched is None else sketched[i])
            positions[i, :found.size], sims[i, :best.size] = found, best
        return positions, sims

    def sketch_candidates(self, queries: np.ndarray, k: int,
                          leave_out: np.ndarray | None = None) -> list[np.ndarray]:
        """Each query's candidates from the sketches, as ``search`` takes them (no filter):
        they do not depend on the probes, so calibration, which searches the same queries
        at several probes, scans the sketches once (their scan of every row was 80% of its
        time) and passes them as ``sketched``."""
        unit = unit_vectors(queries)
        count = self._sketched_count(self.index.ntotal, k, leave_out is not None)
        return [self.sketch.nearest(unit[i:i + 1], count)[0] for i in range(len(unit))]

    @staticmethod
    def _sketched_count(rows: int, k: int, leaving_out: bool) -> int:
        # CANDIDATES_PER_RESULT a result whatever the lists' codes: the sketches' scan of
        # every row slows with the number it keeps.
        return min(rows, max(k, CANDIDATES_PER_RESULT * k) + int(leaving_out))

    def _search_one(self, unit: np.ndarray, k: int, nprobe: int, leave_out: int | None,
                    selector: _Selector | None = None, sketched: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
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
            if nprobe >= self.lists or int((found >= 0).sum()) >= enough:
                break
            nprobe = min(self.lists, 4 * nprobe)
        # ... and the rows of the nearest sketches; a row found both ways counts once.
        if sketched is None and self.scan_sketches:
            sketched = self.sketch.nearest(unit, self._sketched_count(rows, k, bool(extra)),
                                           sel)[0]
        elif sketched is None:
            sketched = np.empty(0, np.int64)
        found = np.unique(np.concatenate([found[0], sketched]))
        found = found[(found >= 0) & (found != (-1 if leave_out is None else leave_out))]
        sims = self.cosines(unit[0], found)
        order = np.argsort(-sims, kind="stable")[:k]
        return found[order], sims[order]

    def cosines(self, unit: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Exact cosine of the stored vectors at ``positions`` to ``unit`` (a unit query):
        every ranking's last step. A query's candidates, and int8 rows however many, go
        through numpy; many float16 rows (an exact scan) through torch, which widens
        float16 several times as fast as numpy. Not int8's: numpy widens those at half
        torch's CPU, and a CLI search that scans a word's rows then need not import torch
        (a second of its start; BENCHMARKS.md, issue 46 latency)."""
        import numpy as np

        if len(positions) < RANK_BLOCK_ROWS or self.vectors.dtype == np.int8:
            sims = np.empty(len(positions), np.float32)
            for start in range(0, len(positions), RANK_BLOCK_ROWS):
                block = np.asarray(self.vectors[positions[start:start + RANK_BLOCK_ROWS]],
                                   np.float32)
                sims[start:start + len(block)] = _block_cosines(block, unit)
            return sims
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

    def exact(self, queries: np.ndarray, k: int, among: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """``search`` by exact cosine over the rows at positions ``among`` (None: every
        row), scanned in blocks: a filtered search, or one asked to be exact. One query at
        a time, as ``search``: an answer is the same alone or in a batch."""
        import numpy as np

        unit = unit_vectors(queries)
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

        from pipeline.lookup.index.lance_search import DISTANCE_COLUMN

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

        # The codes live in faiss's scan only: a second copy was 16 more bytes a row.
        self.planes, self.mean = planes, mean
        self.scan = faiss.IndexBinaryFlat(planes.shape[1])
        self.scan.add(codes)

    @property
    def code_bytes(self) -> int:
        """Bytes of sketch a row."""
        return self.scan.code_size

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


class IdSketch(Sketch):
    """The sketches of some rows, answering with their positions (``ids``)."""

    def __init__(self, planes: np.ndarray, mean: np.ndarray, codes: np.ndarray,
                 ids: np.ndarray) -> None:
        super().__init__(planes, mean, codes)
        self.ids = ids

    def nearest(self, unit: np.ndarray, k: int, sel: Any = None) -> np.ndarray:
        import numpy as np

        found = super().nearest(unit, k, sel)
        return np.where(found >= 0, self.ids[np.maximum(found, 0)], -1)


def add_to_lists(index: Any, lists: np.ndarray, codes: np.ndarray, ids: np.ndarray,
                 filled: np.ndarray | None = None) -> None:
    """``codes`` (of rows ``ids``) into ``index``'s inverted lists ``lists``, as encoded.
    ``filled``: the entries each list holds so far, of lists already sized to their final
    length (``size_lists``): the codes are written in place and ``filled`` advanced, so
    no list grows (a growing list doubles its capacity: a server held 235 bytes a row
    where its codes, ids and sketches are 88)."""
    import faiss
    import numpy as np

    index = inverted(index)
    order = np.argsort(lists, kind="stable")
    ids = np.ascontiguousarray(ids[order], np.int64)
    sorted_lists = lists[order]
    sorted_codes = np.ascontiguousarray(codes[order])
    bounds = np.flatnonzero(np.diff(sorted_lists)) + 1
    invlists = None if filled is None else faiss.downcast_InvertedLists(index.invlists)
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(order)]]),
                      strict=True):
        if hi <= lo:
            continue
        at = int(sorted_lists[lo])
        if invlists is None:
            index.invlists.add_entries(at, int(hi - lo), faiss.swig_ptr(ids[lo:hi]),
                                       faiss.swig_ptr(sorted_codes[lo:hi]))
        else:
            invlists.update_entries(at, int(filled[at]), int(hi - lo),
                                    faiss.swig_ptr(ids[lo:hi]),
                                    faiss.swig_ptr(sorted_codes[lo:hi]))
            filled[at] += hi - lo


def size_lists(index: Any, sizes: np.ndarray) -> np.ndarray:
    """Each of ``index``'s (empty) inverted lists sized to hold ``sizes[list]`` entries, to
    be filled by ``add_to_lists``; the counts filled so far (zeros)."""
    import faiss
    import numpy as np

    invlists = faiss.downcast_InvertedLists(inverted(index).invlists)
    for at in np.flatnonzero(sizes).tolist():
        invlists.resize(at, int(sizes[at]))
    return np.zeros(len(sizes), np.int64)


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
class IvfSearch:
    """A search ``SenseIndex.vector_query`` sends to the in-memory IVF: the same ``to_arrow`` as
    ``VectorSearch``."""

    ivf: MemoryIvf
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


def read_ivf(fs: Any, path: str) -> Any:
    """The faiss index stored at ``path`` on ``fs`` (read in place where it is local)."""
    import faiss
    import numpy as np

    from schemas.dataset import is_local

    if is_local(fs):
        return faiss.read_index(path)
    return faiss.deserialize_index(np.frombuffer(fs.cat(path), np.uint8))


def _block_cosines(candidates: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """Cosine of each float32 row to ``unit``. Products summed, not a matrix product:
    BLAS's threads, for 600 candidates and more, waited on faiss's (and on a busy
    machine's other processes): 100 ms where this takes 1 (BENCHMARKS.md, issue 46)."""
    import numpy as np

    dots = np.einsum("ij,j->i", candidates, unit, optimize=False)
    return dots / np.maximum(np.sqrt(np.einsum("ij,ij->i", candidates, candidates,
                                               optimize=False)), 1e-12)
