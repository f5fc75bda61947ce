"""An item's Parquet files in staging: written through a hashing file, so the commit
record carries each file's size and sha256 without reading it back (pipeline/write/commit.py
checks them), at the final name under a private prefix."""

from __future__ import annotations

import hashlib
import posixpath
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.write.output import STAGING_DIR
from schemas import (
    PARTITION_COLUMN,
    SCALE_SUFFIX,
    TABLE_SCHEMAS,
    layer_columns,
    token_schema,
    types_schema,
)
from schemas.layers import halves_equal, quantize_int8

ROW_GROUP_BYTES = 64 << 20  # ~64 MB row groups: large scans for DuckDB/LanceDB, bounded RAM
SMALL_TABLES = ("sentences", "documents", "errors")


def token_file_compression(schema: Any) -> dict[str, str]:
    """Per-column Parquet codecs for a tokens file (keys are leaf paths, as pyarrow wants).

    zstd everywhere except the contextual layers (``layer_1`` .. ``layer_L``), which get
    snappy: zstd shrinks those activations by only ~9% (464 vs 512 bytes per token for a
    256-d float16 layer of the default model) yet decodes ~5x slower (1.0 vs 5.5 GB/s
    per core here), and decoding them is what mixing on read waits for. Layer 0 is
    context-free, repeated for every occurrence of a word: zstd shrinks it ~5x.
    """
    codecs = {}
    for field in schema:
        name = field.name
        is_vector = pa.types.is_fixed_size_list(field.type)
        leaf = f"{name}.list.element" if is_vector else name
        contextual = is_vector and not name.startswith("layer_0")
        # int8 values are dictionary indices (layer_write_options), one byte each: zstd
        # codes them by their frequencies (~7.4 bits).
        int8 = is_vector and field.type.value_type == pa.int8()
        codecs[leaf] = "snappy" if contextual and not int8 else "zstd"
    return codecs


class _HashingFile:
    """A write-only file that hashes and counts what goes through it."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.digest.update(view)
        self.size += view.nbytes
        self.handle.write(view)
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.handle.flush()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.handle.close()
            self.closed = True


class ItemFiles:
    """The staged files of one attempt at one item: ``_staging/<run>/<attempt>/<table>/
    shard=<item>/<part>.parquet`` (the final name, under a private prefix)."""

    def __init__(self, fs: Any, root: str, run_id: str, part: str, item: int) -> None:
        self.fs, self.root, self.item, self.part = fs, root, item, part
        self.attempt = uuid.uuid4().hex[:12]
        self.prefix = f"{STAGING_DIR}/{run_id}/{self.attempt}"
        self.files: dict[str, str] = {}
        self.sizes: dict[str, int] = {}
        self.sha256: dict[str, str] = {}

    def open(self, table: str) -> _HashingFile:
        rel = f"{self.prefix}/{table}/{PARTITION_COLUMN}={self.item}/{self.part}.parquet"
        path = f"{self.root}/{rel}"
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.files[table] = rel
        return _HashingFile(self.fs.open(path, "wb"))

    def closed(self, table: str, handle: _HashingFile) -> None:
        handle.close()
        self.sizes[table] = handle.size
        self.sha256[table] = handle.digest.hexdigest()


class TokenWriter:
    """Token rows of one item into one Parquet file, in row groups of ~64 MB, and (from
    schema version 3) each distinct token's ``layer_0`` once, into the ``types`` file.

    ``add`` takes rows with every layer as float (``unit_rows``), or for int8 already
    quantized where the model ran (int8 values and their ``_scale`` column, bytewise what
    quantizing here gives: they pass through); the stored form (int8 values and scales,
    layer 0 moved out) is made here.
    """

    def __init__(self, files: ItemFiles, n_output_layers: int, dim: int, dtype: str) -> None:
        self.files, self.dim, self.dtype = files, dim, dtype
        self.schema = token_schema(n_output_layers, dim, dtype)
        self.layer_names = layer_columns(n_output_layers)
        layer_bytes = n_output_layers * dim * {"float16": 2, "float32": 4, "int8": 1}[dtype]
        self.rows_per_group = max(1024, ROW_GROUP_BYTES // max(1, layer_bytes))
        self.handle: _HashingFile | None = None
        self.writer: Any = None
        self.buffer: list[Any] = []
        self.buffered = 0
        self.rows = 0
        self.type_rows: dict[str, int] = {}  # token -> row of the types file
        self.type_vectors: list[np.ndarray] = []
        self.type_scales: list[np.ndarray] = []  # with type_vectors already int8

    def add(self, table: Any) -> None:
        if self.layer_names and "layer_0" not in self.schema.names:
            self._collect_types(table)
            table = table.drop_columns([n for n in ("layer_0", "layer_0" + SCALE_SUFFIX)
                                        if n in table.column_names])
        self.buffer.append(table)
        self.buffered += table.num_rows
        if self.buffered >= self.rows_per_group:
            self._flush()

    def _collect_types(self, table: Any) -> None:
        """Remember layer 0 of each token string not seen before in this item."""
        new: dict[str, int] = {}
        for row, token in enumerate(table.column("token").to_pylist()):
            if token not in self.type_rows and token not in new:
                new[token] = row
        if not new:
            return
        picked = list(new.values())
        vectors = _matrix(table.column("layer_0"))[picked]
        for token in new:
            self.type_rows[token] = len(self.type_rows)
        self.type_vectors.append(np.array(vectors))
        if "layer_0" + SCALE_SUFFIX in table.column_names:
            self.type_scales.append(
                table.column("layer_0" + SCALE_SUFFIX).to_numpy()[picked].astype(np.float32))

    def _stored(self, table: Any) -> Any:
        """Float layers -> this file's stored columns (int8: values then scale)."""
        if self.dtype != "int8":
            return table.cast(self.schema)
        columns = {}
        for name in self.schema.names:
            if name.endswith(SCALE_SUFFIX) or name not in table.column_names:
                continue
            if name in self.layer_names and _is_int8(table.schema.field(name).type):
                columns[name] = table.column(name)  # quantized where the model ran
                columns[name + SCALE_SUFFIX] = table.column(name + SCALE_SUFFIX)
            elif name in self.layer_names:
                columns.update(vector_columns_of(name, _matrix(table.column(name)),
                                                 self.dtype))
            else:
                columns[name] = table.column(name)
        return pa.table(columns).cast(self.schema)

    def _flush(self) -> None:
        if not self.buffer:
            return
        if self.writer is None:
            self.handle = self.files.open("tokens")
            self.writer = pq.ParquetWriter(
                self.handle, self.schema, **layer_write_options(self.schema))
        table = self._stored(pa.concat_tables(self.buffer))
        self.writer.write_table(table, row_group_size=self.rows_per_group)
        self.rows += table.num_rows
        self.buffer, self.buffered = [], 0

    def finish(self) -> int:
        self._flush()
        if self.writer is not None:
            self.writer.close()
            self.files.closed("tokens", self.handle)  # type: ignore[arg-type]
        if self.type_vectors:
            self._write_types()
        return self.rows

    def _write_types(self) -> None:
        vectors = np.concatenate(self.type_vectors)
        # Pre-quantized int8: equal halves of [x; x] quantize to equal halves with the
        # vector's scale, so the check on int8 values agrees with the one on floats.
        halved = halves_equal(vectors)
        schema = types_schema(self.dim, self.dtype, halved)
        name = schema.names[1]
        if halved:
            vectors = vectors[:, : self.dim // 2]
        if self.type_scales:
            stored = {name: pa.FixedSizeListArray.from_arrays(
                          pa.array(np.ascontiguousarray(vectors).reshape(-1)), vectors.shape[1]),
                      name + SCALE_SUFFIX: pa.array(np.concatenate(self.type_scales))}
        else:
            stored = vector_columns_of(name, vectors, self.dtype)
        table = pa.table({"token": pa.array(list(self.type_rows), pa.string()),
                          **stored}).cast(schema)
        handle = self.files.open("types")
        pq.write_table(table, handle, **layer_write_options(schema))
        self.files.closed("types", handle)


def _is_int8(vector_type: Any) -> bool:
    return pa.types.is_fixed_size_list(vector_type) and vector_type.value_type == pa.int8()


def _matrix(column: Any) -> np.ndarray:
    """``[n, dim]`` numpy view of a fixed-size-list column without nulls."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return array.flatten().to_numpy(zero_copy_only=False).reshape(len(array), -1)


def vector_columns_of(name: str, vectors: np.ndarray, dtype: str) -> dict[str, Any]:
    """``[n, dim]`` floats as the stored column(s) of vector ``name`` (``vector_fields``)."""
    dim = vectors.shape[1]
    if dtype != "int8":
        value_type = pa.float16() if dtype == "float16" else pa.float32()
        values = pa.array(np.ascontiguousarray(vectors).reshape(-1), value_type)
        return {name: pa.FixedSizeListArray.from_arrays(values, dim)}
    q, scale = quantize_int8(vectors)
    return {name: pa.FixedSizeListArray.from_arrays(pa.array(q.reshape(-1)), dim),
            name + SCALE_SUFFIX: pa.array(scale, pa.float32())}


def layer_write_options(schema: Any) -> dict[str, Any]:
    """ParquetWriter options of a file with vector columns (tokens, types).

    int8 values go into INT32 pages (Parquet has no 8-bit physical type). Dictionary
    encoding turns them back into one byte each (at most 255 distinct values: 8-bit
    indices), which zstd then entropy-codes: 238 bytes per 256-d vector of the default
    model, against 290 with DELTA_BINARY_PACKED and 356 with PLAIN pages (BENCHMARKS.md),
    and a standard encoding that DuckDB, pyarrow, polars and Spark decode.
    """
    int8_leaves = [f"{f.name}.list.element" for f in schema
                   if pa.types.is_fixed_size_list(f.type) and f.type.value_type == pa.int8()]
    keys = [n for n in ("doc_id", "token") if n in schema.names]
    return dict(
        compression=token_file_compression(schema),
        # Dictionary-encoding float16 lists is 2-4x slower to write and 6-10x to read.
        use_dictionary=keys + int8_leaves,
        write_statistics=[n for n in ("doc_id", "sent_idx", "tok_idx", "char_start",
                                      "char_end") if n in schema.names],
        write_page_checksum=True,  # readers check each page's CRC (dataset_format.md)
    )


def write_small_tables(files: ItemFiles, rows_by_table: dict[str, list[dict]]) -> None:
    """``sentences``, ``documents``, ``errors``: a file only for a table with rows."""
    for name in SMALL_TABLES:
        rows = rows_by_table.get(name)
        if not rows:
            continue
        table = pa.Table.from_pylist(rows, schema=TABLE_SCHEMAS[name])
        handle = files.open(name)
        pq.write_table(table, handle, compression="zstd", write_page_checksum=True)
        files.closed(name, handle)
