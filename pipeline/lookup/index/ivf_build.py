"""Making a full index's IVF folder (``ivf_search`` describes its files), and what the
compact index's build in shards shares with it: how many lists, how many probes.

``elmo index build`` makes it after the LanceDB table (``build.finish_index``), from the
table's own rows in one scan, into a folder of its own beside the table (``_ivf/<name>/``),
which ``_elmo_index.json`` then names (``IndexMeta.ivf``: that write is the commit).

How many lists a query probes is measured at build time, not assumed, because it depends on
the data (BENCHMARKS.md has sets where the rule below chose 12 of 1,000 lists, 192 of 316,
3 of 319). ``CALIBRATION_QUERIES`` stored rows are searched, each with itself left out,
against their exact 10 nearest among all rows; the index keeps the fewest probes in
``PROBE_STEPS`` whose mean recall@10 reaches ``CALIBRATION_RECALL``, or after which twice
the probes gain less than ``CALIBRATION_PLATEAU`` (the recall it reached is recorded
either way).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pipeline.lookup.index.ivf_search import (
    FILES,
    IVF_DIR,
    IVF_FILE,
    IVF_FORMAT,
    READ_BATCH_ROWS,
    ROWS_FILE,
    SKETCH_BITS,
    SKETCH_FILE,
    VECTORS_FILE,
    MemoryIvf,
    Sketch,
    read_ivf,
)
from pipeline.lookup.layers.vectors import unit_vectors

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

CALIBRATION_QUERIES = 500
# Above the 0.95 promised: a mean over 500 queries is good to about +-0.005, and queries
# that are new sentences can differ from stored rows.
CALIBRATION_RECALL = 0.97
# ... or the fewest probes after which twice as many gain less than this (some neighbours
# are found by no number of probes: then more probes only cost time).
CALIBRATION_PLATEAU = 0.002
CALIBRATION_K = 10
# Rows of the exact scan at a time (calibration's truth): 16,384 rows of 1024 wide are
# 32 MB read, 64 MB widened and 33 MB of similarities for 500 queries; 65,536 held ~1.3 GB
# of such temporaries at once, the largest allocation of a build.
EXACT_BLOCK_ROWS = 16_384
PROBE_STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
               1024, 1536, 2048)
# k-means on at most this many rows per list (faiss wants at least 39).
TRAIN_ROWS_PER_LIST = 64
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
# A rebuild after the table changed keeps the coarse centroids and codebooks it was trained
# with while the rows stay within this factor of those it was trained on; LanceDB's own
# vector index is kept by the same rule (index_build). Training was 62 of the 140 s that
# a 1M x 1024 compact index's codes took (BENCHMARKS.md).
RETRAIN_GROWTH = 4


def list_count(rows: int) -> int:
    return max(1, round(rows ** 0.5))


def probe_steps(lists: int) -> list[int]:
    return [p for p in PROBE_STEPS if p < lists] + [lists]


def trained_index(fs: Any, root: str, previous: dict[str, Any] | None, rows: int, dim: int,
                  codes: str) -> Any | None:
    """The IVF of ``previous`` (the ``IndexMeta.ivf`` being replaced) emptied of its rows but
    keeping its training, when it can serve ``rows`` rows of ``dim`` with ``codes``: the
    same codes, and rows within ``RETRAIN_GROWTH`` times those it was trained on. None
    otherwise (and for records older than ``trained_rows``), or if it cannot be read."""
    if previous is None or previous.get("format") != IVF_FORMAT \
            or previous.get("codes", "SQ8") != codes or not previous.get("trained_rows"):
        return None
    trained = previous["trained_rows"]
    if not trained / RETRAIN_GROWTH <= rows <= trained * RETRAIN_GROWTH:
        return None
    try:
        index = read_ivf(fs, f"{root}/{IVF_DIR}/{previous['folder']}/{IVF_FILE}")
    except (OSError, RuntimeError):
        return None  # gone or unreadable: train anew
    if index.d != dim or index.nlist != previous["lists"] or not index.is_trained:
        return None
    index.reset()
    return index


def build_ivf(table: Any, fs: Any, root: str, show_progress: bool = False,
              previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Make the IVF of ``table`` (a full index's LanceDB table, with a ``vector`` column)
    in a new folder under ``root/_ivf``; returns what ``IndexMeta.ivf`` records. The caller
    commits it by writing the metadata, then calls ``drop_other_folders``. ``previous``:
    the record this one replaces, whose training is kept where it fits
    (``trained_index``); every row is encoded again either way."""
    import faiss
    import numpy as np
    import pyarrow.parquet as pq

    from pipeline.lookup.index.progress import phase
    from schemas.dataset import is_local

    version, rows = table.version, table.count_rows()
    dim = table.schema.field("vector").type.list_size
    name = f"v{version}-{uuid.uuid4().hex[:8]}"
    local = is_local(fs)
    work = f"{root}/{IVF_DIR}/{name}" if local else tempfile.mkdtemp(prefix="elmo-ivf-")
    os.makedirs(work, exist_ok=True)
    try:
        vectors, kept_rows = _read_table(table, work, rows, dim, show_progress)
        rng = np.random.default_rng(0)
        index = trained_index(fs, root, previous, rows, dim, "SQ8")
        if index is not None:
            assert previous is not None
            lists, trained_rows = previous["lists"], previous["trained_rows"]
            doing = f"codes over {rows} rows (training of {trained_rows} rows kept)"
        else:
            lists, trained_rows = list_count(rows), rows
            doing = f"codes over {rows} rows"
        with phase(f"index: in-memory IVF: {lists} lists of SQ8 {doing}", show_progress):
            if index is None:
                index = _trained(vectors, rows, dim, lists, rng)
            mean = np.zeros(dim, np.float32)  # of the unit rows: the sketches' centre
            for start in range(0, rows, READ_BATCH_ROWS):
                unit = unit_vectors(vectors[start:start + READ_BATCH_ROWS])
                index.add(unit)
                mean += unit.sum(axis=0)
            mean /= max(1, rows)
        with phase(f"index: in-memory IVF: {SKETCH_BITS}-bit sketches", show_progress):
            planes = Sketch.planes_for(dim)
            sketch_codes = np.concatenate([
                Sketch.encode(unit_vectors(vectors[start:start + READ_BATCH_ROWS]), planes, mean)
                for start in range(0, rows, READ_BATCH_ROWS)])
            np.savez(f"{work}/{SKETCH_FILE}", planes=planes, mean=mean, codes=sketch_codes)
        ivf = MemoryIvf(index, vectors, Sketch(planes, mean, sketch_codes), kept_rows, lists)
        with phase("index: in-memory IVF: measure probes for recall@10", show_progress):
            nprobe, recall, queries = calibrate(ivf, rng)
        faiss.write_index(index, f"{work}/{IVF_FILE}")  # no copy in memory
        pq.write_table(ivf.rows, f"{work}/{ROWS_FILE}", compression="zstd")
        vectors.flush()
        del ivf, vectors
        record = {"format": IVF_FORMAT, "folder": name, "table_version": version,
                  "rows": rows, "lists": lists, "nprobe": nprobe,
                  "recall_at_10": round(recall, 4), "calibration_queries": queries,
                  "codes": "SQ8", "trained_rows": trained_rows}
        if not local:
            for file in FILES:
                fs.put_file(f"{work}/{file}", f"{root}/{IVF_DIR}/{name}/{file}")
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if not local:
        shutil.rmtree(work, ignore_errors=True)
    return record


def _read_table(table: Any, work: str, rows: int, dim: int, show_progress: bool
                ) -> tuple[np.ndarray, pa.Table]:
    """The table's vectors, into ``work``'s vectors file (mapped), and its other columns."""
    import numpy as np
    import pyarrow as pa

    from pipeline.lookup.index.progress import rows_bar

    columns = [f.name for f in table.schema if f.name != "vector"]
    stored_type = np.dtype(table.schema.field("vector").type.value_type.to_pandas_dtype())
    vectors = np.lib.format.open_memmap(f"{work}/{VECTORS_FILE}", mode="w+",
                                        dtype=stored_type, shape=(rows, dim))
    pieces, done = [], 0
    with rows_bar(rows, show_progress) as bar:
        bar.set_description("index: in-memory IVF: read", refresh=False)
        query = table.search().select([*columns, "vector"]).limit(max(1, rows))
        for batch in query.to_batches(batch_size=READ_BATCH_ROWS):
            flat = batch.column("vector").flatten().to_numpy(zero_copy_only=False)
            vectors[done:done + batch.num_rows] = flat.reshape(-1, dim)
            # A copy: a slice of the batch would keep its vectors' buffers alive.
            pieces.append(pa.Table.from_batches([batch.drop_columns(["vector"]).take(
                pa.array(np.arange(batch.num_rows)))]))
            done += batch.num_rows
            bar.update(batch.num_rows)
    if done != rows:
        raise RuntimeError(f"read {done} rows of the index table, expected {rows}")
    return vectors, pa.concat_tables(pieces)


def _trained(vectors: np.ndarray, rows: int, dim: int, lists: int,
             rng: np.random.Generator) -> Any:
    """An empty IVF of 8-bit codes trained on a sample of ``vectors``."""
    import faiss
    import numpy as np

    index = faiss.index_factory(dim, f"IVF{lists},SQ8", faiss.METRIC_INNER_PRODUCT)
    sample = np.sort(rng.choice(rows, min(rows, TRAIN_ROWS_PER_LIST * lists), replace=False))
    index.cp.min_points_per_centroid = 1  # small tables: no warning on stderr
    index.train(unit_vectors(vectors[sample]))
    return index


def calibrate(ivf: MemoryIvf, rng: np.random.Generator,
              on_rows: Callable[[int], Any] | None = None,
              candidates: Sequence[int] = (), sketches_optional: bool = False
              ) -> tuple[int, float, int]:
    """The fewest probes whose recall@10 reaches CALIBRATION_RECALL on stored rows used as
    queries (each left out of its own answer): ``(nprobe, recall, queries)``;
    ``on_rows``: told the rows the exact scan has done (progress). ``candidates``: counts
    of candidates a result to take from the lists, fewest first (product codes rank them
    too roughly for a fixed count to hold the exact neighbours as rows grow): the first
    whose probes reach it, else the one that reached most, is left in ``ivf.candidates``.
    ``sketches_optional``: the lists alone are measured first, and where they reach it
    ``ivf.scan_sketches`` is left False (``ivf_search.sketches_needed``)."""
    import numpy as np

    rows = len(ivf.vectors)
    k = min(CALIBRATION_K, rows - 1)
    lists = ivf.lists
    if k < 1 or lists == 1:
        return lists, 1.0, 0
    picks = np.sort(rng.choice(rows, min(rows, CALIBRATION_QUERIES), replace=False))
    queries = unit_vectors(ivf.vectors[picks])
    # The exact scan before the first search loads the codes (a compact index loads them
    # on first use): a build's peak is then the larger of the two, not their sum
    # (BENCHMARKS.md, issue 46).
    truth = exact_nearest(ivf.vectors, queries, k, picks, on_rows)

    def recall_with(sketched: list[np.ndarray]) -> Callable[[int], float]:
        def recall(nprobe: int) -> float:
            found, _ = ivf.search(queries, k, nprobe=nprobe, leave_out=picks,
                                  sketched=sketched)
            return float(np.mean([len(set(f) & set(t)) / k
                                  for f, t in zip(found, truth, strict=True)]))
        return recall

    counts = candidates or (ivf.candidates,)
    if sketches_optional:
        none = [np.empty(0, np.int64)] * len(picks)
        count, nprobe, reached = _fewest_candidates(ivf, recall_with(none), counts, lists)
        if reached >= CALIBRATION_RECALL:
            ivf.candidates, ivf.scan_sketches = count, False
            return nprobe, reached, len(picks)
    # The sketches' candidates are the same at every probe count: scanned once.
    sketched = ivf.sketch_candidates(queries, k, picks)
    count, nprobe, reached = _fewest_candidates(ivf, recall_with(sketched), counts, lists)
    ivf.candidates, ivf.scan_sketches = count, True
    return nprobe, reached, len(picks)


def _fewest_candidates(ivf: MemoryIvf, recall: Callable[[int], float],
                       counts: Sequence[int], lists: int) -> tuple[int, int, float]:
    """The first of ``counts`` (candidates a result) whose fewest probes reach
    CALIBRATION_RECALL, else the one that reached most: ``(count, nprobe, recall)``."""
    best: tuple[int, int, float] | None = None
    for count in counts:
        ivf.candidates = count
        # More candidates need no fewer probes: start from the last count's.
        nprobe, reached = _fewest_probes(recall, lists, best[1] if best else 1)
        if best is None or reached > best[2]:
            best = (count, nprobe, reached)
        if reached >= CALIBRATION_RECALL:
            break
    assert best is not None
    return best


def _fewest_probes(recall: Callable[[int], float], lists: int, least: int = 1
                   ) -> tuple[int, float]:
    """The fewest of ``probe_steps`` (from ``least`` on) reaching CALIBRATION_RECALL, or
    after which twice as many gain under CALIBRATION_PLATEAU; with the recall reached."""
    measured: dict[int, float] = {}
    for nprobe in [p for p in probe_steps(lists) if p >= least] or [lists]:
        measured[nprobe] = recall(nprobe)
        if measured[nprobe] >= CALIBRATION_RECALL:
            return nprobe, measured[nprobe]
        twice = min(lists, 2 * nprobe)
        if twice != nprobe:
            measured.setdefault(twice, recall(twice))
            if measured[twice] - measured[nprobe] < CALIBRATION_PLATEAU:
                return nprobe, measured[nprobe]
    return lists, measured[lists]


def exact_nearest(vectors: np.ndarray, queries: np.ndarray, k: int,
                  leave_out: np.ndarray, on_rows: Callable[[int], Any] | None = None
                  ) -> np.ndarray:
    """Positions of the ``k`` rows of ``vectors`` with the highest cosine to each query
    (unit vectors), ``leave_out[i]`` excluded for query i: a scan in blocks."""
    import numpy as np

    best_sims = np.full((len(queries), k), -np.inf, np.float32)
    best_rows = np.full((len(queries), k), -1, np.int64)
    for start in range(0, len(vectors), EXACT_BLOCK_ROWS):
        part = unit_vectors(vectors[start:start + EXACT_BLOCK_ROWS])
        sims = queries @ part.T
        del part
        own = (leave_out >= start) & (leave_out < start + sims.shape[1])
        sims[np.flatnonzero(own), leave_out[own] - start] = -np.inf
        # The block's own top k first: merging only those keeps the scan's memory at the
        # block's similarities, not a copy of them with every row's position beside it.
        take = min(k, sims.shape[1])
        top = np.argpartition(-sims, take - 1, axis=1)[:, :take] \
            if take < sims.shape[1] else np.broadcast_to(np.arange(take), sims.shape)
        both_sims = np.concatenate([best_sims, np.take_along_axis(sims, top, axis=1)], axis=1)
        both_rows = np.concatenate([best_rows, top + start], axis=1)
        keep = np.argpartition(-both_sims, k - 1, axis=1)[:, :k]
        best_sims = np.take_along_axis(both_sims, keep, axis=1)
        best_rows = np.take_along_axis(both_rows, keep, axis=1)
        if on_rows is not None:
            on_rows(sims.shape[1])
    return best_rows


def drop_other_folders(fs: Any, root: str, keep: str | Sequence[str] | None) -> None:
    """Remove IVF folders other than ``keep`` (older builds, or ones a stopped build left)."""
    keep = {keep} if isinstance(keep, str) else set(keep or ())
    base = f"{root}/{IVF_DIR}"
    try:
        names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(base, detail=False)]
    except FileNotFoundError:
        return
    for name in names:
        if name not in keep:
            fs.rm(f"{base}/{name}", recursive=True)
