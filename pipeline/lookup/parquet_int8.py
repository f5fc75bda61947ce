"""Direct decoding of int8 vector columns from Parquet (``--dtype int8``).

The pipeline writes an int8 layer as a dictionary-encoded INT32 list column: a
dictionary page of at most 255 values, then data pages of 8-bit dictionary indices
(pipeline/item_files.py). pyarrow reads it the general way, a repetition and a
definition level per value; here a chunk's pages are walked with the page-header parser
of ``parquet_layers``, and with 8-bit indices a bit-packed run of the RLE/bit-packing
hybrid is the indices' bytes as they are: decoding is a copy and a table lookup.
Anything else returns None, and the caller reads the column with pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.lookup.parquet_layers import (
    _DATA_PAGE,
    _DICTIONARY_PAGE,
    _PAGE_HEADER_FIELDS,
    UnsupportedLayoutError,
    VectorColumn,
    _codec,
    _skip_v1_levels,
    _struct,
    _varint,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq


_PLAIN_DICTIONARY, _RLE_DICTIONARY = 2, 8


def int8_columns(metadata: pq.FileMetaData, schema: pa.Schema,
                 names: list[str]) -> dict[str, VectorColumn]:
    """The columns of ``names`` that are fixed-size lists of int8 (INT32 pages)."""
    import pyarrow as pa

    leaves = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    out = {}
    for name in names:
        if name not in schema.names:
            continue
        kind = schema.field(name).type
        leaf = leaves.get(f"{name}.list.element", leaves.get(f"{name}.list.item"))
        if leaf is None or not pa.types.is_fixed_size_list(kind) or kind.value_type != pa.int8():
            continue
        column = metadata.schema.column(leaf)
        out[name] = VectorColumn(name, leaf, kind.list_size, np.dtype(np.int8),
                                 column.max_repetition_level, column.max_definition_level)
    return out


def read_int8_column(source: Any, metadata: pq.FileMetaData, row_group: int,
                     column: VectorColumn) -> np.ndarray | None:
    """One row group's ``[rows, dim]`` int8 values, or None to read it with pyarrow."""
    group = metadata.row_group(row_group)
    try:
        return _int8_chunk(source, group.column(column.leaf), group.num_rows, column)
    except (UnsupportedLayoutError, OSError, ValueError, IndexError):
        return None


def _int8_chunk(source: Any, chunk: pq.ColumnChunkMetaData, rows: int,
                column: VectorColumn) -> np.ndarray:
    if chunk.physical_type != "INT32" or not chunk.dictionary_page_offset:
        raise UnsupportedLayoutError("not a dictionary-encoded INT32 chunk")
    codec = _codec(chunk.compression)
    total = rows * column.dim
    data = source.read_at(chunk.total_compressed_size, chunk.dictionary_page_offset)
    view = memoryview(data)
    out = np.empty(total, np.int8)
    lut: np.ndarray | None = None
    filled = pos = 0
    while pos < len(data) and filled < total:
        header, pos = _struct(data, pos, _PAGE_HEADER_FIELDS)
        kind, compressed_size, size = header.get(1), header.get(3, -1), header.get(2, -1)
        if compressed_size < 0 or size < 0 or pos + compressed_size > len(data):
            raise UnsupportedLayoutError("bad page sizes")
        body = view[pos:pos + compressed_size]
        pos += compressed_size
        if kind == _DICTIONARY_PAGE:
            raw = body if codec is None else codec.decompress(body, decompressed_size=size)
            values = np.frombuffer(raw, "<i4")
            if len(values) == 0 or values.min() < -128 or values.max() > 127:
                raise UnsupportedLayoutError("dictionary values out of int8 range")
            lut = values.astype(np.int8)
            continue
        if kind != _DATA_PAGE or lut is None:
            raise UnsupportedLayoutError(f"page type {kind}")
        page = header.get(5, {})
        if page.get(2) not in (_PLAIN_DICTIONARY, _RLE_DICTIONARY):
            raise UnsupportedLayoutError("value encoding")
        count = page.get(1, -1)
        raw = body if codec is None else memoryview(
            codec.decompress(body, decompressed_size=size, asbytes=False))
        start = _skip_v1_levels(raw, 0, column.max_repetition_level, page.get(4, -1))
        start = _skip_v1_levels(raw, start, column.max_definition_level, page.get(3, -1))
        if count < 0 or filled + count > total:
            raise UnsupportedLayoutError("nulls or a ragged page")
        indices = _byte_indices(raw[start:], count)
        out[filled:filled + count] = lut[indices]
        filled += count
    if filled != total:
        raise UnsupportedLayoutError("value count differs from rows * dim")
    return out.reshape(rows, column.dim)


def _byte_indices(buf: memoryview, count: int) -> np.ndarray:
    """``count`` dictionary indices from a data page's RLE/bit-packed hybrid section
    (its first byte is the bit width, at most 8 for at most 255 dictionary values)."""
    if len(buf) < 1 or not 0 <= buf[0] <= 8:
        raise UnsupportedLayoutError("dictionary index bit width over 8")
    width = buf[0]
    data = np.frombuffer(buf, np.uint8)
    out = np.empty(count, np.uint8)
    filled, pos = 0, 1
    while filled < count:
        header, pos = _varint(buf, pos)
        if header & 1:  # bit-packed: (header >> 1) groups of 8 values, `width` bytes each
            n = (header >> 1) * 8
            size = (header >> 1) * width
            if pos + size > len(data):
                raise UnsupportedLayoutError("truncated bit-packed run")
            take = min(n, count - filled)
            out[filled:filled + take] = _unpack(data[pos:pos + size], width)[:take]
            pos += size
        else:  # RLE: the value in one byte (width <= 8)
            take = n = header >> 1
            if filled + n > count or (width and pos >= len(data)):
                raise UnsupportedLayoutError("bad RLE run")
            out[filled:filled + n] = data[pos] if width else 0
            pos += 1 if width else 0
        filled += take
    return out


def _unpack(packed: np.ndarray, width: int) -> np.ndarray:
    """Values of ``width`` bits packed least significant bit first."""
    if width == 8:
        return packed
    if width == 0:
        return np.zeros(len(packed) * 8, np.uint8)
    bits = np.unpackbits(packed, bitorder="little").reshape(-1, width)
    return (bits << np.arange(width, dtype=np.uint8)).sum(axis=1, dtype=np.uint8)
