"""A Parquet file assembled from pyarrow's column chunks and the int8 chunks encoded here.

``AssembledParquetWriter`` writes files with the same schema, the same Parquet schema
elements and the same ``ARROW:schema`` key as ``pyarrow.parquet.ParquetWriter`` would,
so every reader sees the same table; only who encodes the pages differs:

* the ``fixed_size_list<int8>`` columns: ``schemas.int8_column_chunk`` (fixed-shape
  pages, no per-value level machinery);
* every other column: pyarrow, one row group at a time into memory, with the caller's
  options (codecs, dictionaries, statistics, page CRCs); its column chunks are copied
  into the file as they are and their offsets moved.

The footer is pyarrow's, decoded with ``schemas.thrift_compact``: the schema, key-value
metadata, ``created_by`` and column orders from a file pyarrow writes for the empty
table of the schema, the row groups built here from both kinds of chunks.
"""

from __future__ import annotations

import io
from functools import lru_cache
from typing import Any

import numpy as np

from schemas.int8_column_chunk import ChunkCodec, column_metadata, encode_chunk
from schemas.thrift_compact import I64, STRUCT, Struct, encode_struct, i64, list_of, read_struct

MAGIC = b"PAR1"


def is_int8_list(arrow_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_fixed_size_list(arrow_type) and arrow_type.value_type == pa.int8()


def _leaf_count(arrow_type: Any) -> int:
    """How many Parquet leaf columns an Arrow type is stored as."""
    import pyarrow as pa

    if pa.types.is_struct(arrow_type):
        return sum(_leaf_count(arrow_type.field(i).type) for i in range(arrow_type.num_fields))
    if pa.types.is_map(arrow_type):
        return _leaf_count(arrow_type.key_type) + _leaf_count(arrow_type.item_type)
    if (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
            or pa.types.is_fixed_size_list(arrow_type)):
        return _leaf_count(arrow_type.value_type)
    return 1


def _footer(data: bytes | memoryview) -> Struct:
    """The decoded FileMetaData of a whole Parquet file in memory."""
    data = memoryview(data).cast("B")  # pyarrow's buffers are signed chars
    size = int.from_bytes(data[-8:-4], "little")
    if bytes(data[-4:]) != MAGIC or size + 12 > len(data):
        raise ValueError("not a Parquet file")
    return read_struct(data[-8 - size:-8])[0]


@lru_cache(maxsize=32)
def _template(schema: Any) -> tuple[Struct, tuple[int, ...]]:
    """pyarrow's FileMetaData for the empty table of ``schema``, and each leaf's maximum
    definition level."""
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(schema.empty_table(), sink)
    data = sink.getvalue()
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    max_def = tuple(metadata.schema.column(i).max_definition_level
                    for i in range(metadata.num_columns))
    return _footer(data), max_def


def _chunk_range(chunk: Struct) -> tuple[int, int]:
    """(start, size) of a pyarrow column chunk's pages in its file."""
    meta = chunk[3][1]
    if 14 in meta or any(k in chunk for k in (4, 6, 8, 9)):
        raise ValueError("bloom filters, page indexes and encryption are not supported")
    start = meta[11][1] if 11 in meta else meta[9][1]
    return start, meta[7][1]


def _moved(chunk: Struct, shift: int) -> Struct:
    """A pyarrow ColumnChunk struct with its page offsets moved by ``shift`` bytes."""
    meta = dict(chunk[3][1])
    for key in (9, 10, 11):
        if key in meta:
            meta[key] = i64(meta[key][1] + shift)
    moved = {**chunk, 3: (STRUCT, meta)}
    if chunk.get(2, (I64, 0))[1]:
        moved[2] = i64(chunk[2][1] + shift)
    return moved


class AssembledParquetWriter:
    """Row groups of ``schema`` into ``sink`` (a writable binary file): ``write_row_group``
    takes the other columns as a pyarrow table and each int8 list column as ``[rows,
    dim]`` uint8 dictionary indices (``schemas.layers.quantize_int8_indices``)."""

    def __init__(self, sink: Any, schema: Any, options: dict[str, Any], codec: ChunkCodec,
                 page_rows: int) -> None:
        if page_rows < 1:
            raise ValueError("page_rows must be at least 1")
        self.sink, self.schema, self.options = sink, schema, options
        self.codec, self.page_rows = codec, page_rows
        self.int8_names = [f.name for f in schema if is_int8_list(f.type)]
        self.other_names = [f.name for f in schema if not is_int8_list(f.type)]
        if not self.other_names:
            raise ValueError("the schema needs a column besides the int8 lists")
        import pyarrow as pa

        self.other_schema = pa.schema([schema.field(n) for n in self.other_names],
                                      metadata=schema.metadata)
        self.template, self.max_def = _template(schema)
        self.row_groups: list[Struct] = []
        self.rows = 0
        self.offset = 0
        self._write(MAGIC)

    def _write(self, data: Any) -> None:
        self.sink.write(data)
        self.offset += memoryview(data).nbytes

    def _other_chunks(self, others: Any) -> tuple[memoryview, Struct]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        buffer = pa.BufferOutputStream()
        pq.write_table(others, buffer, row_group_size=max(1, others.num_rows), **self.options)
        data = memoryview(buffer.getvalue()).cast("B")
        groups = _footer(data)[4][1][1]
        if len(groups) != 1:
            raise AssertionError("pyarrow wrote other than one row group")
        return data, groups[0]

    def write_row_group(self, others: Any, int8_indices: dict[str, np.ndarray]) -> None:
        """One row group: ``others`` holds every column but the int8 lists, whose values
        ``int8_indices`` holds by name. A group of no rows is not written."""
        rows = others.num_rows
        if others.column_names != self.other_names:
            raise ValueError(f"the other columns must be {self.other_names}")
        if sorted(int8_indices) != sorted(self.int8_names):
            raise ValueError(f"int8 columns must be {self.int8_names}")
        for name, indices in int8_indices.items():
            dim = self.schema.field(name).type.list_size
            if indices.shape != (rows, dim) or indices.dtype != np.uint8:
                raise ValueError(f"{name}: want uint8 indices of shape ({rows}, {dim})")
        if rows == 0:
            return
        data, pyarrow_group = self._other_chunks(others.cast(self.other_schema))
        theirs = iter(pyarrow_group[1][1][1])
        chunks: list[Struct] = []
        group_start = self.offset
        uncompressed = compressed = 0
        leaf = 0
        for field in self.schema:
            if is_int8_list(field.type):
                encoded = encode_chunk(int8_indices[field.name], 1, self.max_def[leaf],
                                       self.codec, self.page_rows)
                chunks.append(column_metadata(encoded, [field.name, "list", "element"],
                                              self.codec, self.offset, self.max_def[leaf]))
                for piece in encoded.pieces:
                    self._write(piece)
                uncompressed += encoded.uncompressed_size
                compressed += encoded.compressed_size
                leaf += 1
                continue
            for _ in range(_leaf_count(field.type)):
                chunk = next(theirs)
                start, size = _chunk_range(chunk)
                chunks.append(_moved(chunk, self.offset - start))
                self._write(data[start:start + size])
                meta = chunk[3][1]
                uncompressed += meta[6][1]
                compressed += size
                leaf += 1
        group = {k: v for k, v in pyarrow_group.items() if k not in (1, 2, 3, 5, 6, 7)}
        group.update({1: list_of(STRUCT, chunks), 2: i64(uncompressed), 3: i64(rows),
                      5: i64(group_start), 6: i64(compressed)})
        self.row_groups.append(group)
        self.rows += rows

    def close(self) -> None:
        """Write the footer (the sink stays open: its owner closes it)."""
        footer = {k: v for k, v in self.template.items() if k in (1, 2, 5, 6, 7)}
        footer.update({3: i64(self.rows), 4: list_of(STRUCT, self.row_groups)})
        encoded = encode_struct(footer)
        self._write(encoded)
        self._write(len(encoded).to_bytes(4, "little") + MAGIC)
