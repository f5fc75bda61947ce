"""Named layer mixes, applied to stored layers as they are read.

A mix is ELMo's ``gamma * sum_j w_j * h_j`` (``elmo_model.layer_mix``) with fixed weights:

- ``top``: the top biLSTM layer only; ``average``: all layers equally;
- ``layer:<k>``: layer ``k`` alone (``layer:0`` is the context-free char-CNN layer);
- a stored mix (``_mixes.json`` at the dataset root, e.g. one fitted by ``elmo mix fit``);
- an inline JSON object ``{"weights": [...], "gamma": 1.0, "layer_norm": false}``.

``weights`` are the softmax-normalised layer weights (non-negative, summing to 1), so
``top`` is exact (a zero weight, which a finite softmax scalar cannot express). Layers
with weight 0 are never read from disk. With ``layer_norm`` every token's layer vector is
normalised to zero mean and unit variance over its own values before mixing: on read,
there is no batch to normalise over that would not change with how the rows are cut.

Reading for a mix never goes through Python lists: ``iter_mixed`` reads row groups on a
thread pool, takes the float16 layer values straight out of the Parquet data pages
(``pipeline.lookup.parquet_layers``; pyarrow for layouts it does not handle, whose fixed-size-list
values buffer becomes a zero-copy ``[n, dim]`` view) and widens them to float32 only inside
the fused weighted sum.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.lookup.parquet_layers import VectorColumn
    from schemas import DatasetDescriptor

MIXES_FILE = "_mixes.json"
MIXES_FORMAT = "elmo-store/mixes"
BUILTIN_MIXES = ("top", "average", "layer:<k>")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_LN_EPS = 1e-12  # the same epsilon as elmo_model.scalar_mix


@dataclass(frozen=True)
class Mix:
    """Fixed layer weights (summing to 1), a scale and optional per-token layer norm."""

    name: str
    weights: tuple[float, ...]
    gamma: float = 1.0
    layer_norm: bool = False
    info: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        w = np.asarray(self.weights, dtype=np.float64)
        if w.ndim != 1 or len(w) == 0:
            raise ElmoUserError(f"mix {self.name!r}: weights must be a non-empty list")
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ElmoUserError(f"mix {self.name!r}: weights must be finite, >= 0, not all 0")
        if not math.isfinite(self.gamma):
            raise ElmoUserError(f"mix {self.name!r}: gamma must be a finite number")
        # Normalise once so that stored and computed weights agree exactly.
        object.__setattr__(self, "weights", tuple(float(x) for x in w / w.sum()))

    @property
    def n_layers(self) -> int:
        return len(self.weights)

    @property
    def used_layers(self) -> list[int]:
        """Layers with a non-zero weight: the only ones read from disk."""
        return [k for k, w in enumerate(self.weights) if w > 0]

    @property
    def scalars(self) -> list[float]:
        """Softmax scalars giving these weights (``-inf`` for a zero weight)."""
        return [math.log(w) if w > 0 else -math.inf for w in self.weights]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"weights": list(self.weights), "gamma": self.gamma,
                               "layer_norm": self.layer_norm}
        if self.info:
            out["info"] = self.info
        return out

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> Mix:
        if not isinstance(data, Mapping) or "weights" not in data:
            raise ElmoUserError(f"mix {name!r}: expected an object with 'weights'")
        unknown = set(data) - {"weights", "gamma", "layer_norm", "info"}
        if unknown:
            raise ElmoUserError(f"mix {name!r}: unknown keys {sorted(unknown)}")
        try:
            weights = tuple(float(x) for x in data["weights"])
            gamma = float(data.get("gamma", 1.0))
        except (TypeError, ValueError):
            raise ElmoUserError(f"mix {name!r}: weights and gamma must be numbers") from None
        return cls(name, weights, gamma, bool(data.get("layer_norm", False)),
                   dict(data.get("info") or {}))

    def describe(self) -> str:
        ws = ", ".join(f"{w:.3f}" for w in self.weights)
        ln = ", layer_norm" if self.layer_norm else ""
        return f"{self.name}: weights [{ws}], gamma {self.gamma:.4g}{ln}"


def builtin_mix(name: str, n_layers: int) -> Mix | None:
    """``top`` / ``average`` / ``layer:<k>`` for a model with ``n_layers`` output layers."""
    if n_layers < 1:
        return None
    if name == "top":
        return Mix("top", tuple(float(k == n_layers - 1) for k in range(n_layers)))
    if name == "average":
        return Mix("average", (1.0,) * n_layers)
    match = re.fullmatch(r"layer:(\d+)", name)
    if match:
        k = int(match.group(1))
        if k >= n_layers:
            raise ElmoUserError(f"mix {name!r}: this dataset has layers 0..{n_layers - 1}")
        return Mix(name, tuple(float(j == k) for j in range(n_layers)))
    return None


def check_name(name: str) -> str:
    """A name for a stored mix: not a built-in, filename- and SQL-literal-friendly."""
    if not _NAME_RE.match(name) or name in ("top", "average"):
        raise ElmoUserError(f"bad mix name {name!r}: use letters, digits, '_', '.', '-' "
                            "(not 'top', 'average' or 'layer:<k>')")
    return name


# --------------------------------------------------------------------------- storage


def _dataset_fs(dataset: str, storage_options: dict | None = None) -> tuple[Any, str]:
    from pipeline.store import open_output

    return open_output(dataset, storage_options)


def load_mixes(dataset: str, storage_options: dict | None = None) -> dict[str, Mix]:
    """The mixes stored in a dataset (built-ins are not stored)."""
    from pipeline.store import read_json

    fs, root = _dataset_fs(dataset, storage_options)
    data = read_json(fs, f"{root}/{MIXES_FILE}")
    if data is None:
        return {}
    if data.get("format") != MIXES_FORMAT:
        raise ElmoUserError(f"{dataset}/{MIXES_FILE}: not an elmo-store mixes file")
    return {name: Mix.from_json(name, spec) for name, spec in data.get("mixes", {}).items()}


def save_mix(dataset: str, mix: Mix, storage_options: dict | None = None) -> None:
    """Add or replace one named mix in ``_mixes.json`` (read-modify-write, atomic move)."""
    from pipeline.store import write_bytes_atomic

    check_name(mix.name)
    descriptor = read_dataset_descriptor(dataset, storage_options)
    if mix.n_layers != descriptor.n_output_layers:
        raise ElmoUserError(f"mix {mix.name!r} has {mix.n_layers} weights; the dataset has "
                            f"{descriptor.n_output_layers} layers")
    mixes = load_mixes(dataset, storage_options)
    mixes[mix.name] = mix
    fs, root = _dataset_fs(dataset, storage_options)
    body = {"format": MIXES_FORMAT, "version": 1,
            "mixes": {name: m.to_json() for name, m in sorted(mixes.items())}}
    write_bytes_atomic(fs, f"{root}/{MIXES_FILE}",
                       (json.dumps(body, indent=2, sort_keys=True) + "\n").encode())


def resolve_mix(spec: str | Mapping[str, Any] | Mix, n_layers: int,
                stored: Mapping[str, Mix] | None = None) -> Mix:
    """A mix from a name, an inline JSON object (dict or text) or a ``Mix``."""
    if isinstance(spec, Mix):
        mix = spec
    elif isinstance(spec, Mapping):
        mix = Mix.from_json(str(spec.get("name", "custom")), {k: v for k, v in spec.items()
                                                               if k != "name"})
    else:
        text = spec.strip()
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as error:
                raise ElmoUserError(f"inline mix is not valid JSON: {error}") from None
            mix = Mix.from_json("custom", data)
        else:
            found = builtin_mix(text, n_layers)
            if found is None and stored:
                found = stored.get(text)
            if found is None:
                names = ", ".join([*BUILTIN_MIXES, *sorted(stored or {})])
                raise ElmoUserError(f"unknown mix {text!r}; known: {names}")
            mix = found
    if mix.n_layers != n_layers:
        raise ElmoUserError(f"mix {mix.name!r} has {mix.n_layers} weights but the dataset "
                            f"has {n_layers} layers")
    return mix


# --------------------------------------------------------------------------- mixing


def fsl_to_numpy(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``[n, dim]`` numpy view of a fixed-size-list column (no copy for one chunk).

    ``flatten()`` honours slice offsets and is zero-copy for a fixed-size list without
    nulls; several chunks are concatenated (one copy), so callers iterate batches.
    """
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        if array.num_chunks == 1:
            array = array.chunk(0)
        else:
            parts = [fsl_to_numpy(c) for c in array.chunks if len(c)]
            dim = array.type.list_size
            return np.concatenate(parts) if parts else np.zeros((0, dim), np.float32)
    if not pa.types.is_fixed_size_list(array.type):
        raise ElmoUserError(f"expected a fixed-size list column of vectors, got {array.type}")
    dim = array.type.list_size
    if array.null_count:
        raise ElmoUserError("layer column holds nulls")
    values = array.flatten().to_numpy(zero_copy_only=True)
    return values.reshape(len(array), dim)


def _token_layer_norm(layer: np.ndarray) -> np.ndarray:
    x = np.asarray(layer, dtype=np.float32)
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + _LN_EPS)


# Below this many floats numpy is fast enough and keeps small callers from importing torch
# (~1.5 s): the SQL UDF gets DuckDB chunks of 2,048 rows, whose list decoding bounds it at
# ~60k tokens/s anyway; whole row groups (pyarrow fallback) are 10-45M values.
_TORCH_MIN_VALUES = 1 << 22


def mix_arrays(layers: Sequence[np.ndarray | None], mix: Mix) -> np.ndarray:
    """``gamma * sum_j w_j * layers[j]`` as float32; ``layers[j]`` may be None if w_j == 0.

    Same formula as ``elmo_model.layer_mix`` (tests assert equality), fused in place: one
    float32 output and one scratch buffer instead of three temporaries per layer. Large
    batches go through torch, whose float16 -> float32 widening is ~8x numpy's here
    (4.7 vs 0.6 G values/s on one core); both run the same float32 operations in the same
    order (widen, scale, add), so the result is bitwise the same either way.
    """
    used = mix.used_layers
    first = layers[used[0]]
    if first is None:
        raise ValueError("a used layer was not provided")
    for k in used:
        if layers[k] is None:
            raise ValueError(f"layer {k} has weight {mix.weights[k]} but was not provided")
    if mix.layer_norm:
        layers = [None if layer is None else _token_layer_norm(layer) for layer in layers]
    weights = [float(np.float32(mix.weights[k] * mix.gamma)) for k in used]
    chosen = [layers[k] for k in used]
    if first.size >= _TORCH_MIN_VALUES:
        return _mix_torch(chosen, weights)  # type: ignore[arg-type]
    out = np.empty(first.shape, np.float32)
    scratch: np.ndarray | None = None
    for i, (layer, weight) in enumerate(zip(chosen, weights, strict=True)):
        if i == 0:
            np.multiply(layer, np.float32(weight), out=out, dtype=np.float32)
        else:
            if scratch is None:
                scratch = np.empty_like(out)
            np.multiply(layer, np.float32(weight), out=scratch, dtype=np.float32)
            out += scratch
    return out


def _mix_torch(layers: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    import torch

    # Buffers come from numpy: it asks for transparent huge pages, which made first touch
    # of a 45 MB output 3x cheaper than torch.empty here (page faults, not arithmetic,
    # were the cost of widening a row group).
    out = torch.from_numpy(np.empty(layers[0].shape, np.float32))
    scratch = torch.from_numpy(np.empty(layers[0].shape, np.float32)) if len(layers) > 1 \
        else None
    for i, (layer, weight) in enumerate(zip(layers, weights, strict=True)):
        _accumulate(out, _tensor(np.ascontiguousarray(layer)), weight, i == 0, scratch)
    return out.numpy()


def _tensor(array: np.ndarray) -> Any:
    import warnings

    import torch

    with warnings.catch_warnings():
        # Arrow buffers and decompressed pages are read-only; torch warns, but nothing
        # here writes to them.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _accumulate(target: Any, source: Any, weight: float, first: bool, scratch: Any) -> None:
    """``target = w * source`` (first layer) or ``target += w * source``, widened to
    float32: the operation order of ``mix_arrays``'s numpy loop, hence bitwise equal."""
    if first:
        target.copy_(source)
        if weight != 1.0:  # x * 1.0 == x exactly: skipping it changes no bit
            target.mul_(weight)
    else:
        scratch.copy_(source)
        scratch.mul_(weight)
        target.add_(scratch)


# --------------------------------------------------------------------------- dataset reading


@dataclass
class Dataset:
    """A readable dataset: descriptor, file system and the committed files per table."""

    uri: str
    descriptor: DatasetDescriptor
    fs: Any
    root: str
    storage_options: dict | None = None

    def files(self, table: str = "tokens") -> list[str]:
        """Committed files (paths without protocol, for ``fs``): what a strict reader reads."""
        return [path for _, path in self.shard_files(table)]

    def shard_files(self, table: str = "tokens") -> list[tuple[str, str]]:
        """``(key, path)`` per live file; key ``part/shard=k/run_id`` says what it holds.

        The store's live view (``_live.json`` when a job publishes one, else every
        committed shard): what every reader here (SQL views, indexes) goes through."""
        from pipeline.store import live_shards

        return [(s.key, path) for s in live_shards(self.fs, self.root)
                if (path := s.path(self.root, table)) is not None]

    @property
    def is_local(self) -> bool:
        protocol = self.fs.protocol
        return "file" in (protocol if isinstance(protocol, tuple) else (protocol,))

    def arrow_filesystem(self) -> Any:
        import pyarrow.fs as pafs

        if self.is_local:
            return pafs.LocalFileSystem()
        return pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))

    def mixes(self) -> dict[str, Mix]:
        return load_mixes(self.uri, self.storage_options)

    def mix(self, spec: str | Mapping[str, Any] | Mix) -> Mix:
        if self.descriptor.n_output_layers < 1:
            raise ElmoUserError(f"{self.uri} stores no layers to mix")
        return resolve_mix(spec, self.descriptor.n_output_layers, self.mixes())


def read_dataset_descriptor(uri: str, storage_options: dict | None = None) -> DatasetDescriptor:
    from pipeline.store import read_descriptor

    try:
        return read_descriptor(uri, storage_options)
    except (ValueError, TypeError) as error:
        raise ElmoUserError(f"{uri}: unreadable dataset descriptor ({error})") from None


def open_dataset(uri: str, storage_options: dict | None = None) -> Dataset:
    descriptor = read_dataset_descriptor(uri, storage_options)
    fs, root = _dataset_fs(uri, storage_options)
    return Dataset(str(uri), descriptor, fs, root, storage_options)


def _check_layers(ds: Dataset, schema: pa.Schema, mix: Mix, path: str) -> None:
    missing = [f"layer_{k}" for k in mix.used_layers if f"layer_{k}" not in schema.names]
    if missing:
        raise ElmoUserError(f"{path} has no layer columns {missing}: "
                            f"this dataset stores no layers to mix")


def iter_mixed(ds: Dataset, mix: Mix, columns: Sequence[str] = ("doc_id", "sent_idx", "tok_idx",
                                                                  "token"),
               files: Sequence[str] | None = None, batch_rows: int = 1 << 16,
               workers: int | None = None,
               ) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Stream ``(metadata batch, mixed [n, dim] float32)`` over the committed token files.

    Row groups are read and mixed on ``workers`` threads (default: one per core, at most
    4) and yielded in file and row order; at most ``2 * workers`` are in flight. The
    layer columns go through ``pipeline.lookup.parquet_layers`` (pyarrow where a file's layout is
    not the one it decodes), the metadata columns through pyarrow; both release the GIL.
    """
    import os
    import threading
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    paths = list(ds.files("tokens") if files is None else files)
    if batch_rows < 1:
        raise ValueError("batch_rows must be >= 1")
    if not paths:
        return
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    fs = ds.arrow_filesystem()
    buffers = threading.local()  # per worker thread, freed with the pool
    units = ((path, metadata, direct, group)
             for path, metadata, direct in _footers(ds, fs, mix, paths)
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


def _footers(ds: Dataset, fs: Any, mix: Mix, paths: Sequence[str]
             ) -> Iterator[tuple[str, pq.FileMetaData, dict[str, VectorColumn]]]:
    """Each file's footer and its directly readable layer columns, found once per file (a
    file is opened again per row group, on a thread)."""
    import pyarrow.parquet as pq

    from pipeline.lookup.parquet_layers import vector_columns

    layer_names = [f"layer_{k}" for k in mix.used_layers]
    for path in paths:
        with fs.open_input_file(path) as source:
            metadata = pq.read_metadata(source)
        schema = metadata.schema.to_arrow_schema()
        _check_layers(ds, schema, mix, path)
        yield path, metadata, vector_columns(metadata, schema, layer_names)


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
                   direct: dict[str, VectorColumn], group: int, mix: Mix, columns: list[str],
                   buffers: Any) -> tuple[pa.Table, np.ndarray]:
    import pyarrow.parquet as pq

    from pipeline.lookup.parquet_layers import UnsupportedLayoutError

    layer_names = [f"layer_{k}" for k in mix.used_layers]
    with fs.open_input_file(path) as source:
        parquet = pq.ParquetFile(source, metadata=metadata)
        vectors = None
        if len(direct) == len(layer_names) and not mix.layer_norm:
            try:
                vectors = _mix_pages(source, metadata, group, mix,
                                     [direct[name] for name in layer_names], buffers)
            except UnsupportedLayoutError:
                vectors = None
        if vectors is None:
            table = parquet.read_row_group(group, columns=layer_names)
            layers: list[np.ndarray | None] = [None] * mix.n_layers
            for k, name in zip(mix.used_layers, layer_names, strict=True):
                layers[k] = fsl_to_numpy(table.column(name))
            vectors = mix_arrays(layers, mix)
        meta = parquet.read_row_group(group, columns=columns)
    if meta.num_rows != len(vectors):
        raise ElmoUserError(f"{path}: row group {group} has {meta.num_rows} rows but "
                            f"{len(vectors)} vectors")
    return meta, vectors


def _mix_pages(source: Any, metadata: pq.FileMetaData, group: int, mix: Mix,
               columns: Sequence[VectorColumn], buffers: Any) -> np.ndarray:
    """``mix_arrays`` fused with the page reader: each decompressed page is widened,
    scaled and added into its span of the output while it is still in cache.

    The same float32 operations per value as ``mix_arrays`` (widen, scale, add, layer by
    layer), so the result is bitwise the same; what is saved is a float16 copy of every
    layer and full-size scratch passes through memory (at 1024-d the unfused version
    spent more time moving row-group-sized arrays than decoding)."""
    import torch

    from pipeline.lookup.parquet_layers import iter_vector_pages

    row_group = metadata.row_group(group)
    rows, dim = row_group.num_rows, columns[0].dim
    out = np.empty((rows, dim), np.float32)
    flat = torch.from_numpy(out).view(-1)
    weights = [float(np.float32(mix.weights[k] * mix.gamma)) for k in mix.used_layers]
    for i, (column, weight) in enumerate(zip(columns, weights, strict=True)):
        if column.dim != dim:
            raise ElmoUserError(f"layer columns differ in size ({column.dim} vs {dim})")
        start = 0
        chunk = row_group.column(column.leaf)
        read_buffer = _reused(buffers, "chunk", chunk.total_compressed_size, np.uint8)
        for values in iter_vector_pages(source, chunk, rows, column, read_buffer):
            end = start + len(values)
            scratch = None if i == 0 else torch.from_numpy(
                _reused(buffers, "page", len(values), np.float32))
            _accumulate(flat[start:end], _tensor(values), weight, i == 0, scratch)
            start = end
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
