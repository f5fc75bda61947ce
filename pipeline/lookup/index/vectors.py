"""The vectors of a compact sense index's rows, read back from its dataset.

A compact index (``elmo index build --compact``) stores no vectors of its own: each token
row keeps its key back to the dataset (``part``, ``shard`` and ``row``, its row number in
that shard's committed tokens file), and the vectors are mixed on read from the dataset
whenever they are needed: at build time to train and fill the quantized IVF, and when a
process opens the index, for the exact re-rank. Both go through ``read_index_vectors``, so
the vectors a search re-ranks with are the ones the codes were made from.

The index records which committed files it holds (``IndexMeta.indexed``: part, shard and
run id); a dataset whose committed view no longer has one of them (a shard re-embedded, a
part deleted) is refused until ``elmo index build`` brings the index up to date, since the
rows would point at other tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.rows import file_rows, split_key
from pipeline.lookup.layers.mixes import iter_mixed
from schemas.dataset import Dataset
from schemas.layers import cast_floats
from schemas.mix_specs import Mix

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from pipeline.lookup.index.meta import IndexMeta

# The columns of an index row that say where its vector is in the dataset.
KEY_COLUMNS = ("part", "shard", "row")


def committed_paths(ds: Dataset, indexed: Sequence[str], fix: str) -> dict[tuple[str, int], str]:
    """``(part, shard) -> path`` of the committed tokens files ``indexed`` names (keys
    ``part/shard=k/run_id``); a key the dataset no longer commits is a user error whose
    message ends with ``fix``."""
    live = dict(ds.shard_files("tokens"))
    gone = [key for key in indexed if key not in live]
    if gone:
        raise ElmoUserError(
            f"the dataset changed since this compact index was built ({len(gone)} of its "
            f"files are no longer committed, e.g. {gone[0]}); {fix}")
    return {split_key(key): live[key] for key in indexed}


def read_index_vectors(ds: Dataset, mix: Mix, paths: dict[tuple[str, int], str],
                       keys: pa.Table, dtype: str) -> np.ndarray:
    """The mixed vectors ``[len(keys), dim]`` (held as ``dtype``: the index's
    ``vector_dtype``) of the rows ``keys`` (columns ``KEY_COLUMNS``) in their order, mixed
    on read from the files ``paths`` (``committed_paths``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = keys.num_rows
    out = np.empty((n, ds.descriptor.dim), dtype)
    if n == 0:
        return out
    # Each row's file, as an index into the distinct (part, shard) pairs.
    pairs = pa.table({"part": keys.column("part"), "shard": keys.column("shard")})
    distinct = pairs.group_by(["part", "shard"]).aggregate([]).sort_by(
        [("part", "ascending"), ("shard", "ascending")])
    wanted = list(zip(distinct.column("part").to_pylist(),
                      distinct.column("shard").to_pylist(), strict=True))
    missing = [w for w in wanted if w not in paths]
    if missing:
        raise ElmoUserError(f"index rows of part {missing[0][0]!r} shard {missing[0][1]} "
                            "name no file the index holds; rebuild it with --rebuild")
    files = [paths[w] for w in wanted]
    # A row's place in the stream of the files read in order: its file's first row + row.
    first = np.zeros(len(files), np.int64)
    total = 0
    for i, path in enumerate(files):
        first[i] = total
        total += file_rows(ds, [path])
    file_of = pc.index_in(pc.binary_join_element_wise(
        pairs.column("part"), pc.cast(pairs.column("shard"), pa.string()), "\x00"),
        value_set=pa.array([f"{p}\x00{s}" for p, s in wanted])).to_numpy()
    rows = pc.cast(keys.column("row"), "int64").to_numpy()
    stream_row = first[file_of] + rows
    if (rows < 0).any() or (stream_row >= total).any():
        raise ElmoUserError("index rows point past the end of their tokens files; rebuild "
                            "the index with --rebuild")
    order = np.argsort(stream_row, kind="stable")
    sorted_rows = stream_row[order]
    start = 0
    for _, vec in iter_mixed(ds, mix, columns=(), files=files):
        end = start + len(vec)
        lo, hi = np.searchsorted(sorted_rows, [start, end])
        if hi > lo:
            dst, src = order[lo:hi], sorted_rows[lo:hi] - start
            if _is_run(dst) and _is_run(src):  # the usual case: rows kept in stream order
                cast_floats(vec[src[0]:src[-1] + 1], dtype, out=out[dst[0]:dst[-1] + 1])
            else:
                out[dst] = cast_floats(vec[src], dtype)
        start = end
    return out


def _is_run(positions: np.ndarray) -> bool:
    """Whether ``positions`` are ``p, p + 1, ...`` (one slice instead of a gather)."""
    import numpy as np

    return bool((np.diff(positions) == 1).all())


def vectors_from_dataset(meta: IndexMeta, uri: str, storage_options: dict | None = None
                         ) -> Callable[[pa.Table], np.ndarray]:
    """What gives the vectors of a compact index's rows (``MemoryIvf.load``, ``build_ivf``):
    its dataset opened and checked now (same model, every file it holds still committed),
    read when called."""
    from pipeline.lookup.index.meta import moved_dataset_fix
    from schemas.dataset import open_dataset

    fix = (f"bring the index up to date with `elmo index build {meta.dataset} --mix "
           f"{meta.mix_name} --out {uri}`")
    try:
        ds = open_dataset(meta.dataset, storage_options)
    except (ElmoUserError, OSError) as error:
        raise ElmoUserError(f"{uri} is a compact index: its vectors are read from its "
                            f"dataset {meta.dataset}, which is not readable ({error}); "
                            f"{moved_dataset_fix(meta.mix_name, uri)}") from error
    if ds.descriptor.model_fingerprint != meta.model_fingerprint:
        raise ElmoUserError(f"{meta.dataset} now holds another model's vectors than the "
                            f"compact index {uri} was built from; rebuild it with "
                            f"`elmo index build {meta.dataset} --mix {meta.mix_name} --out "
                            f"{uri} --compact --rebuild`")
    paths = committed_paths(ds, meta.indexed, fix)
    mix = meta.the_mix()

    def vectors_of(rows: pa.Table) -> np.ndarray:
        return read_index_vectors(ds, mix, paths, rows.select(list(KEY_COLUMNS)),
                                  meta.vector_dtype)

    return vectors_of
