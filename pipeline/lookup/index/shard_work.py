"""A compact index's per-shard build work (``ivf_shards_build.build_shards`` hands it to a
runner): a new dataset file's rows and their vectors written as a shard (``new_shard``),
and a shard's vectors encoded with the training (``encode``).

Each piece is a ``ShardJob``: its rows (for progress) and a call taking a progress
callback, built from module functions and plain values, so that a runner may run it in
this process (``run_here``) or as a Ray task (``ray_work.ShardTasks``); either writes the
same files.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.ivf_search import READ_BATCH_ROWS, SKETCH_BITS, Sketch
from pipeline.lookup.index.ivf_shards import (
    CODES_FILE,
    LISTS_FILE,
    PLANES_FILE,
    ROWS_FILE,
    SENTENCES_FILE,
    SKETCH_FILE,
    TRAIN_FILE,
    VECTOR_FILES,
    VECTORS_FILE,
    as_shard_vectors,
)
from pipeline.lookup.index.projection import inverted
from pipeline.lookup.index.row_vectors import write_in_place
from pipeline.lookup.index.sentences import SENTENCE_KEY
from pipeline.lookup.index.shard_files import SHARD_VECTOR_DTYPE, with_dictionary_codes
from pipeline.lookup.layers.vectors import unit_vectors

if TYPE_CHECKING:
    import pyarrow as pa

    from schemas.dataset import Dataset

# A piece of per-shard work: its rows (progress) and the call, given a progress callback.
ShardJob = tuple[int, Callable[[Callable[[int], Any]], None]]
ShardRunner = Callable[[Sequence[ShardJob], Callable[[int], Any]], None]
# Rows encoded at a time: faiss's product quantizer computes a table of rows x 256 x
# sub-quantizers floats (4.3 GB for 65,536 rows of 64 bytes).
ENCODE_BATCH_ROWS = 4_096


def run_here(jobs: Sequence[ShardJob], on_rows: Callable[[int], Any]) -> None:
    """Each job in this process, in order (a build without Ray)."""
    for _, call in jobs:
        call(on_rows)


def new_shard(tables: tuple[Any, Any] | str, key: str, folder: str, ds: Dataset, mix: Any,
              path: str, on_rows: Callable[[int], Any]) -> None:
    """The shard of the dataset file ``path`` (``key``) in ``folder``: its rows of the index's
    LanceDB tables (``tables``: tokens and sentences, or the local index folder holding
    them, which a Ray task opens itself), their sentences and their vectors
    (``write_shard``)."""
    if isinstance(tables, str):
        import lancedb

        from pipeline.lookup.index.rows import IndexTables

        opened = IndexTables(lancedb.connect(tables))
        tables = (opened.tokens, opened.sentences)
    table, sentences = tables
    os.makedirs(folder, exist_ok=True)
    if sentences is not None:
        _write_arrow(f"{folder}/{SENTENCES_FILE}", shard_rows(sentences, key, SENTENCE_KEY)
                     .select([*SENTENCE_KEY, "text"]))
    write_shard(folder, ds, mix, path, shard_rows(table, key), on_rows)


def _write_arrow(path: str, rows: pa.Table) -> None:
    import pyarrow as pa

    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, rows.schema) as writer:
        writer.write_table(rows, max_chunksize=READ_BATCH_ROWS)


def write_shard(folder: str, ds: Dataset, mix: Any, path: str, rows: pa.Table,
                on_rows: Callable[[int], Any]) -> None:
    """A shard's ``rows.arrow`` and its vectors: ``rows`` (one tokens file's index rows,
    sorted by ``row``) and where their int8 vectors lie in ``path`` where it allows
    (``row_vectors.write_in_place``), else ``vectors.npy``: the vectors mixed on read
    from ``path``, a batch at a time, stored as int8 (``as_shard_vectors``)."""
    import numpy as np

    from pipeline.lookup.layers.mixes import iter_mixed

    os.makedirs(folder, exist_ok=True)
    _write_arrow(f"{folder}/{ROWS_FILE}", with_dictionary_codes(rows))
    wanted = rows.column("row").to_numpy()
    if write_in_place(folder, ds, mix, path, wanted):
        on_rows(len(wanted))
        return
    dim = ds.descriptor.dim
    with open(f"{folder}/{VECTORS_FILE}", "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {
            "descr": np.lib.format.dtype_to_descr(np.dtype(SHARD_VECTOR_DTYPE)),
            "fortran_order": False,
            "shape": (len(wanted), dim)})
        start = written = 0
        for _, vec in iter_mixed(ds, mix, columns=(), files=[path]):
            end = start + len(vec)
            lo, hi = np.searchsorted(wanted, [start, end])
            if hi > lo:
                picked = wanted[lo:hi] - start
                block = vec[picked[0]:picked[-1] + 1] if picked[-1] - picked[0] == hi - lo - 1 \
                    else vec[picked]
                handle.write(as_shard_vectors(block).tobytes())
                written += hi - lo
                on_rows(hi - lo)
            start = end
    if written != len(wanted):
        raise ElmoUserError(f"{path} holds {start} rows; the index's rows of it point past "
                            "them: rebuild the index with --rebuild")


def shard_rows(table: Any, key: str, order: Sequence[str] = ("row",)) -> pa.Table:
    """The LanceDB rows of one dataset file (``key``), sorted by ``order``."""
    from pipeline.lookup.index.rows import shard_filter

    found = table.search().where(shard_filter(key)).limit(max(1, table.count_rows())) \
        .to_arrow()
    return found.sort_by([(c, "ascending") for c in order]).combine_chunks()


def encode(train_folder: str, source: str, folder: str, rows: int, dim: int,
           on_rows: Callable[[int], Any]) -> None:
    """A shard's codes, lists and sketches in ``folder``, from the vectors in ``source``
    (another folder of the same shard), whose vectors and rows are linked in."""
    import faiss
    import numpy as np

    from pipeline.lookup.index.shard_files import ShardVectors

    index = faiss.read_index(f"{train_folder}/{TRAIN_FILE}")
    with np.load(f"{train_folder}/{PLANES_FILE}") as stored:
        planes, mean = stored["planes"], stored["mean"]
    os.makedirs(folder, exist_ok=True)
    if source != folder:
        for name in (*VECTOR_FILES, ROWS_FILE, SENTENCES_FILE):
            if name == ROWS_FILE or os.path.exists(f"{source}/{name}"):
                _link(f"{source}/{name}", f"{folder}/{name}")
    vectors = ShardVectors.of_folders([folder], [rows], dim)
    lists_index = inverted(index)
    coarse = lists_index.coarse_code_size()
    codes = np.empty((rows, lists_index.code_size), np.uint8)
    lists = np.empty(rows, np.int32)
    sketch = np.empty((rows, SKETCH_BITS // 8), np.uint8)
    for start in range(0, rows, ENCODE_BATCH_ROWS):
        unit = unit_vectors(vectors.read(start, start + ENCODE_BATCH_ROWS))
        both = index.sa_encode(unit)
        stop = start + len(unit)
        lists[start:stop] = sum(both[:, i].astype(np.int32) << (8 * i) for i in range(coarse))
        codes[start:stop] = both[:, coarse:]
        sketch[start:stop] = Sketch.encode(unit, planes, mean)
        on_rows(len(unit))
    np.save(f"{folder}/{CODES_FILE}", codes)
    np.save(f"{folder}/{LISTS_FILE}", lists)
    np.save(f"{folder}/{SKETCH_FILE}", sketch)


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
