"""Mixing stored layers as they are read: the fast side of ``elmo_model.scalar_mix``.

``mix_arrays`` applies a ``Mix`` (``schemas.mix_specs``) to layer arrays, and
``iter_mixed`` streams a dataset's mixed token vectors. Both compute the reference's
``gamma * sum_j w_j * h_j`` (``elmo_model.layer_mix``; tests compare them with it) with
the scale folded into each weight, in one float32 operation order (widen, scale, add,
layer by layer), so that every path here gives bitwise the same vectors:

- ``accumulate`` is that order, once, for numpy arrays and torch tensors alike;
- small arrays go through numpy (no torch import for a SQL chunk), large ones through
  torch, whose float16 -> float32 widening is several times numpy's;
- ``iter_mixed`` reads row groups on a thread pool and, where a file's layout allows,
  takes the float16 values straight out of the Parquet data pages
  (``pipeline.lookup.layers.parquet``) and accumulates page by page while each page is
  still in cache; pyarrow reads any other layout into a zero-copy ``[n, dim]`` view.

Reading never goes through Python lists.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError
from pipeline.lookup.layers.int8 import Int8Column, int8_columns, mix_int8, read_int8_values
from pipeline.lookup.layers.parquet import (
    CorruptPageError,
    UnsupportedLayoutError,
    VectorColumn,
    iter_vector_pages,
    vector_columns,
)
from pipeline.lookup.layers.tokens import (
    TypeVectors,
    check_layers,
    has_own_layer_0,
    layer_vectors,
    read_types,
    stored_columns,
)
from schemas import SCALE_SUFFIX
from schemas.dataset import Dataset
from schemas.mix_specs import Mix

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

_TOKEN_NORM_EPS = 1e-12  # the epsilon of elmo_model.scalar_mix's layer norm


# --------------------------------------------------------------------------- mixing


def _token_norm(layer: np.ndarray) -> np.ndarray:
    """Each token's vector to zero mean and unit variance over its own values."""
    x = np.asarray(layer, dtype=np.float32)
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + _TOKEN_NORM_EPS)


# Below this many floats numpy is fast enough, and small callers (the SQL UDF's chunks of
# a few thousand rows) need not import torch; whole row groups are far above it.
_TORCH_MIN_VALUES = 1 << 22


def scaled_weights(mix: Mix) -> list[float]:
    """``gamma * w_j`` of the used layers, as float32 values: one rounding per weight, the
    same in every path."""
    return [float(np.float32(mix.weights[k] * mix.gamma)) for k in mix.used_layers]


def accumulate(target: Any, source: Any, weight: float, first: bool, scratch: Any) -> None:
    """``target = weight * source`` (first layer) or ``target += weight * source``.

    ``target`` and ``scratch`` are float32 numpy arrays or torch tensors (one kind for
    both), ``source`` a layer of that kind in any float type. The one operation order of
    every mixing path: widen to float32, scale, add."""
    into = target if first else scratch
    if isinstance(into, np.ndarray):
        np.copyto(into, source)
    else:
        into.copy_(source)
    if weight != 1.0:  # x * 1.0 == x exactly: skipping it changes no bit
        into *= weight
    if not first:
        target += into


def mix_arrays(layers: Sequence[np.ndarray | None], mix: Mix) -> np.ndarray:
    """``gamma * sum_j w_j * layers[j]`` as float32; ``layers[j]`` may be None if w_j == 0.

    Computed in place by ``accumulate`` (one output and one scratch buffer instead of
    temporaries per layer), through torch for large inputs: bitwise the same either way.
    """
    if len(layers) != mix.n_layers:
        raise ValueError(f"mix {mix.name!r} has {mix.n_layers} weights but {len(layers)} "
                         "layers were given")
    missing = [k for k in mix.used_layers if layers[k] is None]
    if missing:
        raise ValueError(f"mix {mix.name!r} weighs layers {missing}, which were not given")
    chosen: list[np.ndarray] = [layers[k] for k in mix.used_layers]  # type: ignore[misc]
    shapes = {layer.shape for layer in chosen}
    if len(shapes) > 1:
        raise ValueError(f"layers to mix differ in shape: {sorted(shapes)}")
    if mix.token_norm:
        chosen = [_token_norm(layer) for layer in chosen]
    # Buffers come from numpy also for torch: numpy asks for transparent huge pages, so
    # first touch of a large output costs less than with torch.empty.
    out = np.empty(chosen[0].shape, np.float32)
    scratch = np.empty_like(out) if len(chosen) > 1 else None
    if out.size < _TORCH_MIN_VALUES:
        for i, (layer, weight) in enumerate(zip(chosen, scaled_weights(mix), strict=True)):
            accumulate(out, layer, weight, i == 0, scratch)
        return out
    import torch

    target = torch.from_numpy(out)
    spare = None if scratch is None else torch.from_numpy(scratch)
    for i, (layer, weight) in enumerate(zip(chosen, scaled_weights(mix), strict=True)):
        accumulate(target, _tensor(np.ascontiguousarray(layer)), weight, i == 0, spare)
    return out


def _tensor(array: np.ndarray) -> Any:
    import torch

    with warnings.catch_warnings():
        # Arrow buffers and decompressed pages are read-only; torch warns, but nothing
        # here writes to them.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def iter_mixed(ds: Dataset, mix: Mix, columns: Sequence[str] = ("doc_id", "sent_idx", "tok_idx",
                                                                  "token"),
               files: Sequence[str] | None = None, batch_rows: int = 1 << 16,
               workers: int | None = None,
               ) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Stream ``(metadata batch, mixed [n, dim] float32)`` over the committed token files.

    Row groups are read and mixed on ``workers`` threads (default: one per core, at most
    4) and yielded in file and row order; at most ``2 * workers`` are in flight. The
    layer columns go through ``pipeline.lookup.layers.parquet`` (pyarrow where a file's layout is
    not the one it decodes), the metadata columns through pyarrow; both release the GIL.
    """
    paths = list(ds.paths("tokens") if files is None else files)
    if batch_rows < 1:
        raise ValueError("batch_rows must be >= 1")
    if not paths:
        return
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    fs = ds.arrow_filesystem()
    buffers = threading.local()  # per worker thread, freed with the pool
    units = ((path, metadata, direct, int8, types, group)
             for path, metadata, direct, int8, types in _footers(fs, mix, paths)
             for group in range(metadata.num_row_groups))
    with ThreadPoolExecutor(workers, thread_name_prefix="elmo-mix") as pool:
        pending: deque[Any] = deque()
        for unit in units:
            pending.append(pool.submit(_mix_row_group, fs, *unit, mix, list(columns),
                                       buffers))
            if len(pending) >= 2 * workers:
                yield from _split(*pending.popleft().result(), batch_rows)
        while pending:
            yield from _split(*pending.popleft().result(), batch_rows)


def _footers(fs: Any, mix: Mix, paths: Sequence[str]
             ) -> Iterator[tuple[str, pq.FileMetaData, dict[str, VectorColumn],
                                 dict[str, Int8Column], TypeVectors | None]]:
    """Each file's footer, its directly readable layer columns (float and int8) and
    (version 3, when the mix uses layer 0) its types file, read once per file (a file is
    opened again per row group, on a thread)."""
    import pyarrow.parquet as pq

    layer_names = [f"layer_{k}" for k in mix.used_layers]
    for path in paths:
        with fs.open_input_file(path) as source:
            metadata = pq.read_metadata(source)
        schema = metadata.schema.to_arrow_schema()
        check_layers(schema, layer_names, path)
        types = (read_types(fs, path) if "layer_0" in layer_names
                 and not has_own_layer_0(schema) else None)
        yield (path, metadata, vector_columns(metadata, schema, layer_names),
               int8_columns(metadata, schema, layer_names), types)


def _reused(buffers: Any, slot: str, size: int, dtype: type) -> np.ndarray:
    """A flat array of ``size`` items, kept by this thread for its next row group.

    Fresh multi-MB arrays cost more in page faults (and, with transparent huge pages,
    compaction) than decoding fills them: reuse is what keeps a worker busy decoding."""
    held = getattr(buffers, slot, None)
    if held is None or len(held) < size:
        held = np.empty(size, dtype)
        setattr(buffers, slot, held)
    return held[:size]


def _mix_row_group(fs: Any, path: str, metadata: pq.FileMetaData,
                   direct: dict[str, VectorColumn], int8: dict[str, Int8Column],
                   types: TypeVectors | None, group: int, mix: Mix, columns: list[str],
                   buffers: Any) -> tuple[pa.Table, np.ndarray]:
    """One row group's metadata columns and mixed vectors; a page that fails its CRC
    (our page reader or pyarrow's) is a damaged file, named with the fix."""
    try:
        return _read_row_group(fs, path, metadata, direct, int8, types, group, mix, columns,
                               buffers)
    except (CorruptPageError, OSError) as error:
        if not isinstance(error, CorruptPageError) and "checksum" not in str(error).lower():
            raise
        raise CorruptPageError(
            f"{path}: {error}; run `elmo dataset verify` on the dataset, then rerun its "
            "`elmo embed` with --repair") from None


def _read_row_group(fs: Any, path: str, metadata: pq.FileMetaData,
                    direct: dict[str, VectorColumn], int8: dict[str, Int8Column],
                    types: TypeVectors | None, group: int, mix: Mix, columns: list[str],
                    buffers: Any) -> tuple[pa.Table, np.ndarray]:
    import pyarrow.parquet as pq

    layer_names = [f"layer_{k}" for k in mix.used_layers]
    schema = metadata.schema.to_arrow_schema()
    with fs.open_input_file(path) as source:
        parquet = pq.ParquetFile(source, metadata=metadata, page_checksum_verification=True)
        layers_file = _keyed_by_token(source, metadata)
        vectors = None
        if int8 and not mix.token_norm:
            try:
                vectors = _mix_int8_pages(source, layers_file, group, mix, int8, types,
                                          buffers)
            except UnsupportedLayoutError:
                vectors = None
        if vectors is None and direct and not mix.token_norm:
            # Layers the page reader cannot take (int8, layer 0 from the types file) are
            # read whole and accumulated in their turn: the same order, the same bits.
            others = [n for n in layer_names if n not in direct]
            read = layers_file.read_row_group(group, columns=stored_columns(schema, others)
                                          ) if others else None
            sources = [direct[n] if n in direct else layer_vectors(read, n, types)
                       for n in layer_names]
            try:
                vectors = _mix_pages(source, metadata, group, mix, sources, buffers)
            except UnsupportedLayoutError:
                vectors = None
        if vectors is None:
            table = layers_file.read_row_group(group,
                                               columns=stored_columns(schema, layer_names))
            layers: list[np.ndarray | None] = [None] * mix.n_layers
            for k, name in zip(mix.used_layers, layer_names, strict=True):
                layers[k] = layer_vectors(table, name, types)
            vectors = mix_arrays(layers, mix)
        meta = parquet.read_row_group(group, columns=columns)
    if meta.num_rows != len(vectors):
        raise ElmoUserError(f"{path}: row group {group} has {meta.num_rows} rows but "
                            f"{len(vectors)} vectors")
    return meta, vectors


def _mix_pages(source: Any, metadata: pq.FileMetaData, group: int, mix: Mix,
               columns: Sequence[VectorColumn | np.ndarray], buffers: Any) -> np.ndarray:
    """``mix_arrays`` fused with the page reader: each decompressed page is widened,
    scaled and added into its span of the output (``accumulate``) while it is still in
    cache, so the result is bitwise ``mix_arrays``'s. What fusing saves is a float16 copy
    of every layer and full-size scratch passes through memory: at 1024-d the unfused
    version spent more time moving row-group-sized arrays than decoding."""
    import torch

    row_group = metadata.row_group(group)
    rows = row_group.num_rows
    dim = next(c.dim if isinstance(c, VectorColumn) else c.shape[1] for c in columns)
    out = np.empty((rows, dim), np.float32)
    flat = torch.from_numpy(out).view(-1)
    for i, (column, weight) in enumerate(zip(columns, scaled_weights(mix), strict=True)):
        if isinstance(column, np.ndarray):  # read whole: one accumulate over every row
            if column.shape != out.shape:
                raise ElmoUserError(f"layer arrays differ in shape ({column.shape} vs "
                                    f"{out.shape})")
            scratch = None if i == 0 else torch.from_numpy(
                _reused(buffers, "page", out.size, np.float32))
            accumulate(flat, _tensor(np.ascontiguousarray(column).reshape(-1)), weight,
                       i == 0, scratch)
            continue
        if column.dim != dim:
            raise ElmoUserError(f"layer columns differ in size ({column.dim} vs {dim})")
        start = 0
        chunk = row_group.column(column.leaf)
        read_buffer = _reused(buffers, "chunk", chunk.total_compressed_size, np.uint8)
        for values in iter_vector_pages(source, chunk, rows, column, read_buffer):
            end = start + len(values)
            scratch = None if i == 0 else torch.from_numpy(
                _reused(buffers, "page", len(values), np.float32))
            accumulate(flat[start:end], _tensor(values), weight, i == 0, scratch)
            start = end
    return out


def _keyed_by_token(source: Any, metadata: pq.FileMetaData) -> pq.ParquetFile:
    """The file as read for its layers: ``token`` only serves as the key of layer 0 in
    the types file, so it is read as the dictionary the writer stored it in, and
    ``TypeVectors.rows_for`` looks up each distinct string once instead of every row's."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(source, metadata=metadata, read_dictionary=["token"],
                          page_checksum_verification=True)


def _mix_int8_pages(source: Any, layers_file: pq.ParquetFile, group: int, mix: Mix,
                    columns: dict[str, Int8Column], types: TypeVectors | None,
                    buffers: Any) -> np.ndarray | None:
    """The mix of a row group whose used layers are int8 columns (and layer 0 from the
    types file), decoded by ``pipeline.lookup.layers.int8`` and mixed in one pass; None
    when some used layer is stored otherwise. ``layers_file``: ``_keyed_by_token``'s."""
    metadata = layers_file.metadata
    used = [f"layer_{k}" for k in mix.used_layers]
    # ``_footers`` reads a types file only for a file without its own layer 0
    from_types = used[0] == "layer_0" and types is not None
    if from_types and types.stored_int8 is None:  # type: ignore[union-attr]
        return None
    stored = used[1:] if from_types else used
    if not (stored or from_types) or any(name not in columns for name in stored):
        return None
    row_group = metadata.row_group(group)
    rows = row_group.num_rows
    dim = columns[stored[0]].dim if stored else types.layer_0.shape[1]  # type: ignore[union-attr]
    if any(columns[name].dim != dim for name in stored) or (
            from_types and types.layer_0.shape[1] != dim):  # type: ignore[union-attr]
        return None
    read = layers_file.read_row_group(
        group, columns=[n + SCALE_SUFFIX for n in stored] + (["token"] if from_types else []))
    values = _reused(buffers, "int8", len(stored) * rows * dim, np.int8
                     ).reshape(len(stored), rows, dim)
    for j, name in enumerate(stored):
        chunk = row_group.column(columns[name].leaf)
        read_buffer = _reused(buffers, "chunk", chunk.total_compressed_size, np.uint8)
        read_int8_values(source, chunk, rows, columns[name], values[j].reshape(-1),
                         read_buffer)
    scales = np.empty((len(stored), rows), np.float32)
    for j, name in enumerate(stored):
        scales[j] = read.column(name + SCALE_SUFFIX).to_numpy()
    weights = np.array(scaled_weights(mix), np.float32)
    out = np.empty((rows, dim), np.float32)
    if from_types:
        type_values, type_scales = types.stored_int8  # type: ignore[union-attr,misc]
        rows_of_type = types.rows_for(read.column("token"))  # type: ignore[union-attr]
        mix_int8(out, (type_values, type_scales, rows_of_type), weights[0], values, scales,
                 weights[1:])
    else:
        mix_int8(out, None, 1.0, values, scales, weights)
    return out


def _split(meta: pa.Table, vectors: np.ndarray, batch_rows: int
           ) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    import pyarrow as pa

    if meta.num_columns == 0:  # no metadata asked for: batches that only carry a row count
        meta = pa.table({"_": pa.nulls(len(vectors))}).drop_columns(["_"])
    start = 0
    for batch in meta.combine_chunks().to_batches(max_chunksize=batch_rows):
        if batch.num_rows:
            yield batch, vectors[start:start + batch.num_rows]
            start += batch.num_rows
