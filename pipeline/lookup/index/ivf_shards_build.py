"""Making a compact index's IVF in shards (``ivf_shards`` describes the files), with memory
that does not grow with the rows.

1. **Shards.** Each dataset file the index holds and no current shard does gets a folder:
   its LanceDB rows (one file's, sorted by ``row``) and their vectors, mixed on read from
   the dataset one batch at a time and written as they come.
2. **Training** on a bounded sample (``TRAIN_ROWS_PER_LIST`` rows a list, at most
   ``TRAIN_MAX_ROWS``) read from the shards' vector files; kept from the previous build
   while the rows stay within ``RETRAIN_GROWTH`` of those it was trained on.
3. **Codes.** Each shard not encoded with this training is read in blocks and encoded
   into a new folder (its vectors and rows linked, not copied).
4. **Probes**, measured on a held sample of stored rows against their exact neighbours
   (a scan of every shard's vectors in blocks), as ``ivf_build.calibrate`` does.

Steps 1 and 3 are work a shard at a time (``shard_work``): done in this process, or, for a
refresh on a Ray cluster, one Ray task a shard (``pipeline/lookup/ray_work.py``), which
write the same files. A folder is never changed once written: a build writes new ones
and ``_elmo_index.json`` names them (the commit), so a build killed at any point leaves
the previous index as it was. Before it starts, a build checks that its memory and disk
fit (``check_fits``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.ivf_build import (
    PQ_MIN_ROWS,
    PQ_TRAIN_POINTS_PER_CENTROID,
    PQ_TRAIN_ROUNDS,
    RETRAIN_GROWTH,
    calibrate,
    list_count,
)
from pipeline.lookup.index.ivf_search import (
    IVF_DIR,
    Sketch,
)
from pipeline.lookup.index.ivf_shards import (
    CANDIDATE_STEPS,
    CODE_BYTES,
    MEMORY_BYTES_PER_ROW,
    PLANES_FILE,
    SENTENCES_FILE,
    SHARD_FILES,
    SHARDS_FORMAT,
    TRAIN_FILE,
    TRAIN_FILES,
    VECTOR_FILES,
    ShardedIvf,
    _local_copy,
    is_sharded,
    local_fs,
    projected,
    return_freed_heap,
    shard_missing,
)
from pipeline.lookup.index.projection import (
    VALUES_PER_CODE_BYTE,
    principal_projection,
    with_projection,
)
from pipeline.lookup.index.shard_files import SHARD_VECTOR_DTYPE
from pipeline.lookup.index.shard_work import (
    ShardJob,
    ShardRunner,
    encode,
    new_shard,
    run_here,
)
from pipeline.lookup.layers.vectors import unit_vectors

if TYPE_CHECKING:
    import numpy as np

    from pipeline.lookup.index.meta import IndexMeta
    from schemas.dataset import Dataset

TRAIN_ROWS_PER_LIST = 48
# The training sample's bound (float32 rows): what keeps a build's memory flat in rows.
TRAIN_MAX_ROWS = 131_072
# ... and so the lists' bound: a list trains on at least 32 rows.
MAX_LISTS = TRAIN_MAX_ROWS // 32
SAMPLE_BLOCK_ROWS = 8_192
# A search probes this many times the lists that held rows needed (``build_shards``).
NEW_QUERY_PROBES = 2
# What a build's process holds besides the training sample and the codes it measures
# probes with (the interpreter, torch, LanceDB, a batch being mixed).
BASE_BYTES = 900 << 20


def lists_for(rows: int) -> int:
    return min(MAX_LISTS, list_count(rows))


def codes_for(rows: int, dim: int) -> str:
    """Product-quantized codes of ``dim`` (projected) values, ``VALUES_PER_CODE_BYTE`` a
    byte up to ``CODE_BYTES`` bytes (residuals of the coarse centroid), once there are
    enough rows to train them, else 8-bit scalar codes."""
    if rows >= PQ_MIN_ROWS:
        for subs in range(max(1, min(CODE_BYTES, dim // VALUES_PER_CODE_BYTE)), 0, -1):
            if dim % subs == 0:
                return f"PQ{subs}"
    return "SQ8"


def train_rows_for(rows: int, lists: int, codes: str) -> int:
    wanted = TRAIN_ROWS_PER_LIST * lists if codes == "SQ8" \
        else max(TRAIN_ROWS_PER_LIST * lists, PQ_MIN_ROWS)
    return min(rows, wanted, TRAIN_MAX_ROWS)


def bytes_needed(rows: int, dim: int) -> int:
    """Peak memory of a build (and of a process that searches every row's codes)."""
    sample = train_rows_for(rows, lists_for(rows), codes_for(rows, dim))
    # The projected sample (every direction kept, at most), its residuals, one block.
    return BASE_BYTES + 2 * sample * dim * 4 + 2 * rows * MEMORY_BYTES_PER_ROW


def free_memory() -> int:
    """Bytes this machine can still give (``MemAvailable``), or a large number where the
    kernel does not say."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def check_fits(rows: int, new_rows: int, dim: int, itemsize: int, work: str) -> None:
    """A user error before anything is written when a build of ``rows`` rows (``new_rows``
    of them new, their vectors written under ``work``) would not fit this machine."""
    need, free = bytes_needed(rows, dim), free_memory()
    if need > free:
        raise ElmoUserError(
            f"an index of {rows:,} rows needs about {need / 2**30:.1f} GiB of memory here "
            f"({MEMORY_BYTES_PER_ROW} bytes a row of codes, twice, plus a training sample); "
            f"{free / 2**30:.1f} GiB are free. Index fewer rows (--words, --min-count / "
            f"--max-count), or search it across a Ray cluster (docs/index_sizing.md)")
    disk = new_rows * dim * itemsize
    os.makedirs(work, exist_ok=True)
    room = shutil.disk_usage(work).free
    if disk > room:
        raise ElmoUserError(f"the index's new vectors need {disk / 2**30:.1f} GiB on disk "
                            f"under {work}; {room / 2**30:.1f} GiB are free")


def projected_sample(vectors: Any, rows: int, take: int, rng: np.random.Generator,
                     on_rows: Callable[[int], Any] | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``take`` rows of ``vectors`` (``ShardVectors``) at random, as unit float32 rows
    projected on their principal directions (``projection.principal_projection``): the
    sample, the projection ``[dim, kept]`` and the unit rows' mean. Read twice, a block at
    a time: once for their second moment and mean, once to project them, so that the
    sample is never held at full width (287 MB at 70,128 rows of 1024, growing with the
    lists: a build's largest allocation that grew with rows). ``on_rows``: told the rows
    read (progress; twice ``take`` in all)."""
    import numpy as np

    picks = np.sort(rng.choice(rows, take, replace=False))
    dim = vectors.shape[1]
    second = np.zeros((dim, dim), np.float64)
    total = np.zeros(dim, np.float64)

    def blocks() -> Iterator[tuple[int, np.ndarray]]:
        # Blocks of a few thousand rows: a block is a second or so of reads.
        for start in range(0, take, SAMPLE_BLOCK_ROWS):
            block = picks[start:start + SAMPLE_BLOCK_ROWS]
            yield start, unit_vectors(vectors.read_rows(block))
            if on_rows is not None:
                on_rows(len(block))

    for _, unit in blocks():
        second += unit.T @ unit
        total += unit.sum(axis=0)
    projection = principal_projection(second / max(1, take))
    out = np.empty((take, projection.shape[1]), np.float32)
    for start, unit in blocks():
        out[start:start + len(unit)] = unit @ projection
    return out, projection, (total / max(1, take)).astype(np.float32)


def train(folder: str, sample: np.ndarray, lists: int, codes: str, projection: np.ndarray,
          mean: np.ndarray, on_step: Callable[[int], Any] | None = None) -> None:
    """The empty trained IVF behind ``projection`` (``[dim, kept]``, from
    ``projection.principal_projection``) and the sketches' planes and centre ``mean`` (of
    the unit rows), from ``sample``: the sample's unit rows projected. ``on_step``: told
    of each step done (``train_steps``: a round of the coarse k-means, a sub-quantizer of
    the product codes), so that a long training shows progress. ``sample`` is overwritten
    by its residuals (product codes): no copy of it is made."""
    import faiss
    import numpy as np

    dim = sample.shape[1]
    index = faiss.index_factory(dim, f"IVF{lists},{codes}", faiss.METRIC_INNER_PRODUCT)
    if hasattr(index, "do_polysemous_training"):
        index.do_polysemous_training = False  # unused here (ivf_build)
        index.pq.cp.max_points_per_centroid = PQ_TRAIN_POINTS_PER_CENTROID
        index.pq.cp.niter = PQ_TRAIN_ROUNDS
    index.cp.min_points_per_centroid = 1  # small tables: no warning on stderr
    if hasattr(index, "pq"):
        index.pq.cp.min_points_per_centroid = 1
    step = on_step or (lambda n: None)
    # The coarse k-means one round a call: each starts from the last one's centroids, and
    # the result is faiss's own (the same sample, the same rounds).
    coarse = faiss.Clustering(dim, lists, _one_round(index.cp))
    for _ in range(index.cp.niter):
        coarse.train(sample, faiss.IndexFlatIP(dim))
        step(1)
    centroids = faiss.vector_to_array(coarse.centroids).reshape(lists, dim)
    index.quantizer.add(centroids)
    if hasattr(index, "pq"):
        _train_product_codes(index, sample, centroids, step)
    else:
        index.train(sample)  # the scalar quantizer's ranges: the quantizer is trained
    os.makedirs(folder, exist_ok=True)
    faiss.write_index(with_projection(projection, index), f"{folder}/{TRAIN_FILE}")
    np.savez(f"{folder}/{PLANES_FILE}", planes=Sketch.planes_for(projection.shape[0]),
             mean=mean.astype(np.float32))


def train_steps(codes: str, dim: int) -> int:
    """The steps ``train`` reports for ``codes`` of ``dim`` values: the coarse rounds,
    then one a sub-quantizer of product codes."""
    import faiss

    index = faiss.index_factory(dim, f"IVF1,{codes}", faiss.METRIC_INNER_PRODUCT)
    return index.cp.niter + (index.pq.M if hasattr(index, "pq") else 0)


def _one_round(cp: Any) -> Any:
    import faiss

    one = faiss.ClusteringParameters()
    for name in ("nredo", "spherical", "int_centroids", "update_index", "frozen_centroids",
                 "min_points_per_centroid", "max_points_per_centroid", "seed",
                 "decode_block_size"):
        setattr(one, name, getattr(cp, name))
    one.niter = 1
    return one


def _train_product_codes(index: Any, sample: np.ndarray, centroids: np.ndarray,
                         step: Callable[[int], Any]) -> None:
    """``IndexIVFPQ.train``'s codes, a sub-quantizer at a time: each a k-means of the
    residuals' slice (what ``ProductQuantizer.train`` runs in one call). The residuals
    are made in ``sample``'s place, a block of rows at a time: ``sample - centroids[...]``
    held two more copies of the sample (575 MB at 70,128 rows of 1024, 1 GB at
    ``TRAIN_MAX_ROWS``), a build's largest allocation once its sample grew with rows."""
    import faiss
    import numpy as np

    pq = index.pq
    _, assigned = index.quantizer.search(sample, 1)
    for start in range(0, len(sample), SAMPLE_BLOCK_ROWS):
        block = slice(start, start + SAMPLE_BLOCK_ROWS)
        sample[block] -= centroids[assigned[block, 0]]
    residuals = sample
    trained = np.empty((pq.M, pq.ksub, pq.dsub), np.float32)
    for m in range(pq.M):
        clus = faiss.Clustering(pq.dsub, pq.ksub, pq.cp)
        clus.train(np.ascontiguousarray(residuals[:, m * pq.dsub:(m + 1) * pq.dsub]),
                   faiss.IndexFlatL2(pq.dsub))
        trained[m] = faiss.vector_to_array(clus.centroids).reshape(pq.ksub, pq.dsub)
        step(1)
    faiss.copy_array_to_vector(trained.ravel(), pq.centroids)
    pq.sync_transposed_centroids()
    index.is_trained = True
    index.precompute_table()


def build_shards(table: Any, fs: Any, root: str, meta: IndexMeta, ds: Dataset,
                 files: dict[str, str], show_progress: bool = False,
                 run: ShardRunner | None = None, sentences: Any = None) -> dict[str, Any]:
    """Bring the sharded IVF of ``meta`` (a compact index) to the files ``meta.indexed``
    names (``files``: key -> the dataset's path); returns what ``IndexMeta.ivf`` records.
    ``table``, ``sentences``: the index's token and sentence tables (LanceDB).
    The caller commits it by writing the metadata, then calls ``drop_other_folders``.
    ``run``: what runs the per-shard work (``shard_work``; ``ray_work.ShardTasks``: Ray
    tasks), for an index on local storage; by default this process does."""
    import numpy as np

    from pipeline.lookup.index.progress import rows_bar
    from schemas.dataset import is_local

    previous = meta.ivf if is_sharded(meta.ivf) else None
    local = is_local(fs)
    base = f"{root}/{IVF_DIR}" if local else tempfile.mkdtemp(prefix="elmo-ivf-")
    made: list[str] = []
    try:
        if previous is not None and not local:
            _local_copy(fs, f"{root}/{IVF_DIR}", previous, base)
        kept = {key: s for key, s in (previous or {}).get("shards", {}).items()
                if key in files and shard_missing(fs if local else local_fs(), base, s) is None}
        new = [key for key in meta.indexed if key not in kept]
        counts = {key: int(kept[key]["rows"]) for key in kept}
        new_rows = {key: table.count_rows(_filter(key)) for key in new}
        rows = sum(counts.values()) + sum(new_rows.values())
        if rows == 0:
            raise ElmoUserError("the index holds no rows to search")
        check_fits(rows, sum(new_rows.values()), meta.dim,
                   np.dtype(SHARD_VECTOR_DTYPE).itemsize, base)
        shards: dict[str, dict[str, Any]] = {}
        here = run is None or not local  # an object store's goes through a local folder
        jobs: list[ShardJob] = []
        for key in new:
            folder = f"s-{uuid.uuid4().hex[:12]}"
            made.append(folder)
            # A Ray task opens the tables itself (a table object does not travel).
            jobs.append((new_rows[key], partial(
                new_shard, (table, sentences) if here else root, key, f"{base}/{folder}", ds,
                meta.the_mix(), files[key])))
            shards[key] = {"folder": folder, "rows": new_rows[key], "train": None}
        with rows_bar(sum(new_rows.values()), show_progress) as bar:
            bar.set_description("index: shards: mix + write vectors", refresh=False)
            (run_here if here else run)(jobs, bar.update)
        shards |= kept
        shards = {key: shards[key] for key in meta.indexed}
        return_freed_heap()  # what the shards' rows left: the training's peak is next
        record = _train_or_keep(previous, base, shards, rows, meta.dim, show_progress, made)
        stale = [key for key, s in shards.items() if s.get("train") != record["train"]]
        jobs = []
        for key in stale:
            folder = f"s-{uuid.uuid4().hex[:12]}"
            made.append(folder)
            jobs.append((shards[key]["rows"], partial(
                encode, f"{base}/{record['train']}", f"{base}/{shards[key]['folder']}",
                f"{base}/{folder}", shards[key]["rows"], meta.dim)))
            shards[key] = {"folder": folder, "rows": shards[key]["rows"],
                           "train": record["train"]}
        with rows_bar(sum(shards[k]["rows"] for k in stale), show_progress) as bar:
            bar.set_description(f"index: {record['codes']} codes", refresh=False)
            (run_here if here else run)(jobs, bar.update)
        record["shards"] = shards
        record["rows"] = rows
        ivf = ShardedIvf.from_folders(base, {**record, "nprobe": 1}, "`elmo index build`")
        with rows_bar(rows, show_progress) as bar:
            bar.set_description("index: probes for recall@10: exact neighbours of held rows",
                                refresh=False)
            nprobe, recall, queries = calibrate(
                ivf, np.random.default_rng(1), bar.update,
                CANDIDATE_STEPS if record["codes"] != "SQ8" else (), sketches_optional=True)
        # Held rows sit in their own lists; a new sentence's tokens fall farther from
        # theirs: at the probes that gave held rows 0.97, new ones found 0.93-0.96 of
        # the exact 10, at twice as many 0.97 for ~5% more CPU (BENCHMARKS.md, issue 46).
        record |= {"nprobe": min(record["lists"], NEW_QUERY_PROBES * nprobe),
                   "recall_at_10": round(recall, 4), "held_rows_nprobe": nprobe,
                   "calibration_queries": queries, "candidates": ivf.candidates,
                   "sketches": ivf.scan_sketches}
        if not local:
            for folder in made:
                names = TRAIN_FILES if folder.startswith("t-") \
                    else (*SHARD_FILES, *VECTOR_FILES, SENTENCES_FILE)
                for name in names:
                    if os.path.exists(f"{base}/{folder}/{name}"):
                        fs.put_file(f"{base}/{folder}/{name}",
                                    f"{root}/{IVF_DIR}/{folder}/{name}")
    except BaseException:
        if local:
            for folder in made:
                shutil.rmtree(f"{base}/{folder}", ignore_errors=True)
        raise
    finally:
        if not local:
            shutil.rmtree(base, ignore_errors=True)
    return record


def _filter(key: str) -> str:
    from pipeline.lookup.index.rows import shard_filter

    return shard_filter(key)


def _train_or_keep(previous: dict[str, Any] | None, base: str, shards: dict[str, Any],
                   rows: int, dim: int, show_progress: bool, made: list[str]
                   ) -> dict[str, Any]:
    """The training record: the previous one where it serves ``rows`` rows, else a new
    one trained on a sample of the shards' vectors."""
    import numpy as np

    from pipeline.lookup.index.progress import rows_bar, steps_bar
    from pipeline.lookup.index.shard_files import ShardVectors

    codes = codes_for(rows, dim)
    # A training made before the projection is made again (its codes rank too roughly).
    if previous is not None and projected(previous) and previous.get("dim") == dim \
            and (previous["codes"] == "SQ8") == (codes == "SQ8") \
            and previous["trained_rows"] / RETRAIN_GROWTH <= rows \
            <= previous["trained_rows"] * RETRAIN_GROWTH \
            and all(os.path.exists(f"{base}/{previous['train']}/{n}") for n in TRAIN_FILES):
        return {k: previous[k] for k in ("format", "train", "lists", "codes", "trained_rows",
                                         "dim", "train_sample", "projected_dim")}
    lists = lists_for(rows)
    take = train_rows_for(rows, lists, codes)
    folder = f"t-{uuid.uuid4().hex[:12]}"
    made.append(folder)
    vectors = ShardVectors.of_folders([f"{base}/{s['folder']}" for s in shards.values()],
                                      [s["rows"] for s in shards.values()], dim)
    with rows_bar(2 * take, show_progress) as bar:
        bar.set_description("index: read the training sample (twice)", refresh=False)
        sample, projection, mean = projected_sample(vectors, rows, take,
                                                    np.random.default_rng(0), bar.update)
    kept = projection.shape[1]
    codes = codes_for(rows, kept)
    with steps_bar(train_steps(codes, kept), show_progress,
                   f"index: train {lists} lists of {codes} codes in {kept} of {dim} "
                   f"directions on {take:,} of {rows:,} rows") as bar:
        train(f"{base}/{folder}", sample, lists, codes, projection, mean, bar.update)
    return {"format": SHARDS_FORMAT, "train": folder, "lists": lists, "codes": codes,
            "trained_rows": rows, "dim": dim, "train_sample": take, "projected_dim": kept}


def ivf_folders(record: dict[str, Any] | None) -> list[str]:
    """The folders under ``_ivf`` that ``record`` (``IndexMeta.ivf``) uses."""
    if record is None:
        return []
    if "shards" not in record:  # one folder: the in-memory IVF of a full index
        return [record["folder"]]
    # In shards, of this format or an older one (whose folders a build replaces).
    return [record["train"], *(s["folder"] for s in record["shards"].values())]


def shards_current(fs: Any, root: str, record: dict[str, Any] | None,
                   indexed: Sequence[str]) -> bool:
    """Whether ``record`` is an IVF in shards holding exactly the files ``indexed``, each
    encoded with its training and present under ``root``."""
    if not is_sharded(record) or "nprobe" not in record or not projected(record):
        return False
    shards = record["shards"]
    return list(shards) == list(indexed) \
        and all(s.get("train") == record["train"] for s in shards.values()) \
        and all(fs.exists(f"{root}/{IVF_DIR}/{record['train']}/{n}") for n in TRAIN_FILES) \
        and all(shard_missing(fs, f"{root}/{IVF_DIR}", s) is None for s in shards.values())
