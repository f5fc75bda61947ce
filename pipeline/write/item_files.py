"""An item's Parquet files in staging: written through a hashing file, so the commit
record carries each file's size and sha256 without reading it back (pipeline/write/commit.py
checks them), at the final name under a private prefix.

Files with int8 layers are written by ``schemas.parquet_assembly.AssembledParquetWriter``:
the int8 layer pages by ``schemas.int8_column_chunk`` from dictionary indices quantized
as rows arrive (``AssembledRowGroups``), every other column by pyarrow. ``encoder=
"pyarrow"`` writes the same tables with pyarrow alone: the readable reference the fast
writer is tested against (tests/pipeline/test_assembled_parquet.py)."""

from __future__ import annotations

import hashlib
import posixpath
import uuid
from typing import TYPE_CHECKING, Any

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
from schemas.int8_column_chunk import ChunkCodec
from schemas.layers import (
    halves_equal,
    int8_as_indices,
    quantize_int8,
    quantize_int8_indices,
    quantize_int8_into,
)
from schemas.parquet_assembly import AssembledParquetWriter, is_int8_list

if TYPE_CHECKING:
    from elmo_model.device_copy import TypeLayer0

ROW_GROUP_BYTES = 64 << 20  # ~64 MB row groups: large scans for DuckDB/LanceDB, bounded RAM
PAGE_BYTES = 1 << 20  # int8 data pages of whole rows, about pyarrow's default page size
# Uncompressed since 2026-11-29: zstd saved ~10% on int8 layers, and plain pages let a
# sense index read its rows in place (docs/dataset_format.md, "Compact index").
INT8_CODEC = ChunkCodec()
# Who encodes int8 layer pages: "assembled" (schemas.int8_column_chunk, the default) or
# "pyarrow" (the reference: pyarrow writes every column; tests compare the two).
ENCODERS = ("assembled", "pyarrow")
SMALL_TABLES = ("sentences", "documents", "errors")


def token_file_compression(schema: Any) -> dict[str, str]:
    """Per-column Parquet codecs for a tokens file (keys are leaf paths, as pyarrow wants).

    zstd everywhere except the float contextual layers (``layer_1`` .. ``layer_L``), which
    get snappy: zstd shrinks those activations little yet decodes several times slower,
    and decoding them is what mixing on read waits for. Layer 0 is context-free, repeated
    for every occurrence of a word: zstd shrinks it well (BENCHMARKS.md, "Storage format").
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

    ``add`` takes rows with every layer as float (``rows_of_unit``), or for int8 already
    quantized (int8 values and their ``_scale`` column, bytewise what quantizing here
    gives: ``rows_of_unit`` quantizes each window, a GPU model stage each batch); the stored
    form (int8 dictionary indices and scales, layer 0 moved out) is made here.
    """

    def __init__(self, files: ItemFiles, n_output_layers: int, dim: int, dtype: str,
                 encoder: str = "assembled") -> None:
        if encoder not in ENCODERS:
            raise ValueError(f"encoder {encoder!r}: use one of {', '.join(ENCODERS)}")
        self.files, self.dim, self.dtype, self.encoder = files, dim, dtype, encoder
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
        self.type_scales: list[np.ndarray] = []  # when the layers come quantized
        self.assembled = (AssembledRowGroups(self.schema, self.rows_per_group)
                          if dtype == "int8" and encoder == "assembled" else None)

    def add(self, table: Any, layer_0: TypeLayer0 | None = None) -> None:
        """``layer_0``: when the rows come without it, layer 0 of (at least) their
        tokens, once per token type (``Int8Layers.layer_0``)."""
        if self.layer_names and "layer_0" not in self.schema.names:
            self._collect_types(table, layer_0)
            table = table.drop_columns([n for n in ("layer_0", "layer_0" + SCALE_SUFFIX)
                                        if n in table.column_names])
        if self.assembled is not None:
            self._add_assembled(table)
            return
        self.buffer.append(table)
        self.buffered += table.num_rows
        if self.buffered >= self.rows_per_group:
            self._flush()

    def _add_assembled(self, table: Any) -> None:
        """Quantize the rows into the row group being filled, writing each full one."""
        groups = self.assembled
        assert groups is not None
        start = 0
        while start < table.num_rows:
            taken = groups.add(table, start)
            start += taken
            if groups.full:
                self._write_group()

    def _write_group(self) -> None:
        groups = self.assembled
        assert groups is not None
        if not groups.rows:
            return
        if self.writer is None:
            self.handle = self.files.open("tokens")
            self.writer = groups.writer(self.handle)
        self.rows += groups.write(self.writer)

    def _collect_types(self, table: Any, layer_0: TypeLayer0 | None = None) -> None:
        """Remember layer 0 of each token string not seen before in this item (and its
        scales when the layers come quantized): from the rows' ``layer_0`` column, or
        from ``layer_0`` per type (the same bytes: layer 0 is context free)."""
        new: dict[str, int] = {}
        for row, token in enumerate(table.column("token").to_pylist()):
            if token not in self.type_rows and token not in new:
                new[token] = row
        if not new:
            return
        if layer_0 is not None:
            rows = layer_0.rows_of(list(new))
            vectors, scales = layer_0.values[rows], layer_0.scales[rows]
        else:
            picked = list(new.values())
            vectors = np.array(_matrix(table.column("layer_0"))[picked])
            scales = (table.column("layer_0" + SCALE_SUFFIX).to_numpy()[picked]
                      if "layer_0" + SCALE_SUFFIX in table.column_names else None)
        for token in new:
            self.type_rows[token] = len(self.type_rows)
        self.type_vectors.append(vectors)
        if scales is not None:
            self.type_scales.append(scales.astype(np.float32))

    def _stored(self, table: Any) -> Any:
        """Float layers -> this file's stored columns (int8: values then scale)."""
        if self.dtype != "int8":
            return table.cast(self.schema)
        columns = {}
        for name in self.schema.names:
            if name.endswith(SCALE_SUFFIX) or name not in table.column_names:
                continue
            if name in self.layer_names and is_int8_list(table.schema.field(name).type):
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
        if self.assembled is not None:
            self._write_group()
        else:
            self._flush()
        if self.writer is not None:
            self.writer.close()
            self.files.closed("tokens", self.handle)  # type: ignore[arg-type]
        if self.type_vectors:
            self._write_types()
        return self.rows

    def _write_types(self) -> None:
        vectors = np.concatenate(self.type_vectors)
        halved = halves_equal(vectors)
        schema = types_schema(self.dim, self.dtype, halved)
        name = schema.names[1]
        if halved:
            vectors = vectors[:, : self.dim // 2]
        # Quantized where the model ran: equal halves of [x; x] quantize to equal halves
        # with the vector's scale, so the check on int8 values agrees with the floats'.
        stored = {name: vectors}
        if self.type_scales:
            stored[name + SCALE_SUFFIX] = np.concatenate(self.type_scales)
        handle = self.files.open("types")
        tokens = pa.array(list(self.type_rows), pa.string())
        if self.dtype == "int8" and self.encoder == "assembled":
            groups = AssembledRowGroups(schema, len(vectors))
            groups.add(pa.table({"token": tokens}), 0, stored)
            writer = groups.writer(handle)
            groups.write(writer)
            writer.close()
        else:
            columns = (vector_columns_of(name, vectors, self.dtype) if not self.type_scales
                       else {name: pa.FixedSizeListArray.from_arrays(pa.array(
                                np.ascontiguousarray(vectors).reshape(-1)), vectors.shape[1]),
                             name + SCALE_SUFFIX: pa.array(stored[name + SCALE_SUFFIX])})
            table = pa.table({"token": tokens, **columns}).cast(schema)
            pq.write_table(table, handle, **layer_write_options(schema))
        self.files.closed("types", handle)


class AssembledRowGroups:
    """The row group being filled of a file with int8 layers, for ``AssembledParquetWriter``:
    each int8 column quantized as rows arrive, into buffers reused for every group (its
    dictionary indices and scales), the other columns kept as Arrow slices."""

    def __init__(self, schema: Any, rows_per_group: int) -> None:
        self.schema, self.capacity = schema, max(1, rows_per_group)
        self.int8_names = [f.name for f in schema if is_int8_list(f.type)]
        self.scale_names = {name + SCALE_SUFFIX: name for name in self.int8_names}
        self.plain_names = [f.name for f in schema
                            if f.name not in self.int8_names and f.name not in self.scale_names]
        dims = {name: schema.field(name).type.list_size for name in self.int8_names}
        self.indices = {n: np.empty((self.capacity, d), np.uint8) for n, d in dims.items()}
        self.scales = {n: np.empty(self.capacity, np.float32) for n in self.int8_names}
        self.plain: list[Any] = []
        self.rows = 0

    @property
    def full(self) -> bool:
        return self.rows == self.capacity

    def add(self, table: Any, start: int, vectors: dict[str, np.ndarray] | None = None) -> int:
        """Take rows of ``table`` from ``start`` until the group is full; returns how many.
        An int8 column's vectors come from ``table`` (fixed-size lists) or, by name, from
        ``vectors`` (``[rows of table, dim]``): floats are quantized here; int8 values
        (quantized where the model ran) come with their ``_scale`` column or entry."""
        take = min(table.num_rows - start, self.capacity - self.rows)
        part = table.slice(start, take)
        end = self.rows + take
        given = vectors or {}
        for name in self.int8_names:
            values = (given[name][start:start + take] if name in given
                      else _matrix(part.column(name)))
            indices, scales = self.indices[name][self.rows:end], self.scales[name][self.rows:end]
            if values.dtype != np.int8:
                quantize_int8_indices(values, indices, scales)
                continue
            scale_name = name + SCALE_SUFFIX
            scales[:] = (given[scale_name][start:start + take] if scale_name in given
                         else part.column(scale_name).to_numpy())
            int8_as_indices(values, out=indices)
        self.plain.append(part.select(self.plain_names))
        self.rows = end
        return take

    def writer(self, handle: Any) -> AssembledParquetWriter:
        others = pa.schema([f for f in self.schema if f.name not in self.int8_names])
        pages = max(1, PAGE_BYTES // max(1, *(d.shape[1] for d in self.indices.values())))
        return AssembledParquetWriter(handle, self.schema, layer_write_options(others),
                                      INT8_CODEC, pages)

    def write(self, writer: AssembledParquetWriter) -> int:
        """Write the group (then empty it); returns its rows."""
        rows = self.rows
        plain = pa.concat_tables(self.plain)
        columns = {name: (pa.array(self.scales[self.scale_names[name]][:rows], pa.float32())
                          if name in self.scale_names else plain.column(name))
                   for name in writer.other_names}
        writer.write_row_group(pa.table(columns),
                               {name: self.indices[name][:rows] for name in self.int8_names})
        self.plain, self.rows = [], 0
        return rows


def quantized_layer_columns(layers: list[np.ndarray], lo: np.ndarray, hi: np.ndarray,
                            n_out: int, dim: int) -> dict[str, Any]:
    """``layer_k`` (int8) and ``layer_k_scale`` of a unit's stored tokens, from the model's
    float ``layers`` (one ``[n_out, n, dim]`` array per window, its tokens ``lo:hi``
    stored): each window's rows quantized where they lie (``quantize_int8_into``), so
    the unit is never copied as floats; the writer takes these as it takes layers
    quantized on a GPU."""
    total = int(np.sum(hi - lo))
    values = np.empty((n_out, total, dim), np.int8)
    scales = np.empty((n_out, total), np.float32)
    at = 0
    for window, a, b in zip(layers, lo, hi, strict=True):
        end = at + int(b - a)
        for k in range(n_out):
            quantize_int8_into(window[k, a:b], values[k, at:end], scales[k, at:end])
        at = end
    return int8_layer_columns(values, scales)


def int8_layer_columns(values: np.ndarray, scales: np.ndarray, first: int = 0
                       ) -> dict[str, Any]:
    """Columns ``layer_k`` (int8 lists) and ``layer_k_scale`` for ``k = first, first + 1,
    ...`` of quantized layers: ``values`` int8 ``[layers, n, dim]``, ``scales`` ``[layers,
    n]``."""
    dim = values.shape[-1]
    columns: dict[str, Any] = {}
    for k in range(values.shape[0]):
        columns[f"layer_{first + k}"] = pa.FixedSizeListArray.from_arrays(
            pa.array(values[k].reshape(-1), pa.int8()), dim)
        columns[f"layer_{first + k}{SCALE_SUFFIX}"] = pa.array(scales[k], pa.float32())
    return columns


def _matrix(column: Any) -> np.ndarray:
    """``[n, dim]`` numpy view of a fixed-size-list column without nulls."""
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    array = column
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
    indices), which zstd then entropy-codes: fewer bytes than DELTA_BINARY_PACKED or PLAIN
    pages (BENCHMARKS.md, "int8 layer pages"), and a standard encoding that DuckDB,
    pyarrow, polars and Spark decode. The assembled writer encodes int8 layer pages itself
    the same way; these options are pyarrow's for the other columns and the reference.
    """
    int8_leaves = [f"{f.name}.list.element" for f in schema
                   if pa.types.is_fixed_size_list(f.type) and f.type.value_type == pa.int8()]
    keys = [n for n in ("doc_id", "token") if n in schema.names]
    return dict(
        compression=token_file_compression(schema),
        # Dictionary-encoding float lists is slower to write and to read, for no gain.
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
