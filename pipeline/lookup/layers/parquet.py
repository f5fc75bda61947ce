"""Direct decoding of vector columns from Parquet: the read half of mix on read.

pyarrow reads a ``fixed_size_list<halffloat>[dim]`` column the general way: it decodes a
repetition and a definition level for every float and rebuilds list offsets and validity
from them. At 256-1024 floats per token that bookkeeping, not decompression, is the
bound, even uncompressed (BENCHMARKS.md has the figures).

The layer columns the pipeline writes are the case the format lets us read directly:
PLAIN-encoded float16 (``FIXED_LEN_BYTE_ARRAY(2)``) or float32 values, no dictionary, no
null lists or values. Then the value section of each data page is a run of the row-major
``[rows, dim]`` matrix, and reading a column chunk means: walk its pages (the page headers
are Thrift compact-protocol structs, decoded by ``schemas.thrift_compact``; the few fields
needed are picked from them), decompress
each page with pyarrow's codec, skip the level sections, copy the values out.

Each page's CRC (PageHeader field 4, CRC-32 of the page bytes as stored), when the writer
recorded one, is checked before the page is decoded: a mismatch raises
``CorruptPageError`` rather than returning numbers or falling back.

Every assumption is checked, from the column chunk's metadata (physical and logical type,
encodings, dictionary, codec) and on each page (as many values as levels, i.e. nothing
null; in total ``rows * dim``). ``read_vector_column`` returns None for a chunk that fails
a check (``iter_vector_pages`` raises ``UnsupportedLayoutError``), and the caller reads it
with pyarrow: files from other writers stay readable, only slower. Tests compare the two
readers bitwise.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from zlib_ng import zlib_ng

from elmo_model.errors import ElmoUserError
from schemas.thrift_compact import (
    BOOL,
    DATA_PAGE,
    DATA_PAGE_V2,
    I8,
    I16,
    I32,
    I64,
    INDEX_PAGE,
    PLAIN,
    RLE,
    STRUCT,
    Struct,
    ThriftError,
    read_struct,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

# Parquet codec name (as pyarrow reports it) -> pyarrow codec. "LZ4" is left out on
# purpose: old writers used it for Hadoop-framed LZ4, which pyarrow's codec cannot read.
_CODECS = {"SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd",
           "LZ4_RAW": "lz4_raw"}

# Which PageHeader fields to decode (field id -> nested spec, or True for a scalar).
_DATA_PAGE_FIELDS = {1: True, 2: True, 3: True, 4: True}
_DATA_PAGE_V2_FIELDS = {1: True, 2: True, 3: True, 4: True, 5: True, 6: True, 7: True}
PAGE_HEADER_FIELDS: dict[int, Any] = {1: True, 2: True, 3: True, 4: True,
                                       5: _DATA_PAGE_FIELDS, 8: _DATA_PAGE_V2_FIELDS}


class UnsupportedLayoutError(Exception):
    """A chunk or page outside what the direct path handles: read it with pyarrow."""


class CorruptPageError(ElmoUserError):
    """A page whose bytes do not match the CRC its writer recorded: the file is damaged
    (no reader should decode it; ``elmo dataset verify`` names the work item)."""


# --------------------------------------------------------------------------- Thrift


def _picked(fields: Struct, wanted: dict[int, Any]) -> dict[int, Any]:
    """The integer, bool and (nested) struct fields of a decoded struct named in
    ``wanted``, as bare values; a named field of another type is a layout we do not read."""
    out: dict[int, Any] = {}
    for field_id, spec in wanted.items():
        if field_id not in fields:
            continue
        kind, value = fields[field_id]
        if kind == STRUCT and isinstance(spec, dict):
            out[field_id] = _picked(value, spec)
        elif kind in (BOOL, I8, I16, I32, I64):
            out[field_id] = value
        else:
            raise UnsupportedLayoutError(f"page header field {field_id} has Thrift type {kind}")
    return out


def page_header(data: Any, pos: int, wanted: dict[int, Any]) -> tuple[dict[int, Any], int]:
    """The page header at ``pos`` (its ``wanted`` fields) and the position after it."""
    try:
        fields, pos = read_struct(data, pos)
    except (ThriftError, IndexError, struct.error) as error:  # cut short or not Thrift
        raise UnsupportedLayoutError(f"page header: {error}") from None
    return _picked(fields, wanted), pos


# --------------------------------------------------------------------------- chunks


@dataclass(frozen=True)
class VectorColumn:
    """Where one vector column's values are in a file, and how to decode them."""

    name: str
    leaf: int  # index among the file's leaf columns
    dim: int
    dtype: np.dtype
    max_repetition_level: int
    max_definition_level: int


def fixed_size_list_leaves(metadata: pq.FileMetaData, schema: pa.Schema, names: list[str]
                           ) -> Iterator[tuple[str, int, pa.DataType, Any]]:
    """``(name, leaf index, value type, leaf)`` for each column of ``names`` stored in this
    file as a fixed-size list in the plain 3-level list layout (the only one the page
    readers take)."""
    import pyarrow as pa

    leaves: dict[str, int] = {}
    for i in range(metadata.num_columns):
        leaves.setdefault(metadata.schema.column(i).path.split(".")[0], i)
    for name in names:
        if name not in schema.names or name not in leaves:
            continue
        kind = schema.field(name).type
        if not pa.types.is_fixed_size_list(kind):
            continue
        leaf = metadata.schema.column(leaves[name])
        if leaf.path in (f"{name}.list.element", f"{name}.list.item"):
            yield name, leaves[name], kind, leaf


def vector_columns(metadata: pq.FileMetaData, schema: pa.Schema,
                   names: list[str]) -> dict[str, VectorColumn]:
    """The columns of ``names`` that are fixed-size lists of float16/float32 in this file
    (others are absent from the result and must be read by pyarrow)."""
    import pyarrow as pa

    dtypes = {pa.float16(): np.dtype("<f2"), pa.float32(): np.dtype("<f4")}
    return {name: VectorColumn(name, leaf_index, kind.list_size, dtypes[kind.value_type],
                               leaf.max_repetition_level, leaf.max_definition_level)
            for name, leaf_index, kind, leaf in fixed_size_list_leaves(metadata, schema, names)
            if kind.value_type in dtypes}


def page_codec(name: str) -> Any:
    import pyarrow as pa

    if name == "UNCOMPRESSED":
        return None
    if name not in _CODECS or not pa.Codec.is_available(_CODECS[name]):
        raise UnsupportedLayoutError(f"codec {name}")
    return pa.Codec(_CODECS[name])


def _check_chunk(chunk: pq.ColumnChunkMetaData, column: VectorColumn) -> None:
    expected_physical = "FIXED_LEN_BYTE_ARRAY" if column.dtype.itemsize == 2 else "FLOAT"
    if chunk.physical_type != expected_physical:
        raise UnsupportedLayoutError(f"physical type {chunk.physical_type}")
    if chunk.has_dictionary_page or chunk.dictionary_page_offset:
        raise UnsupportedLayoutError("dictionary page")
    if not set(chunk.encodings) <= {"PLAIN", "RLE"}:
        raise UnsupportedLayoutError(f"encodings {chunk.encodings}")


def _skip_v1_levels(page: memoryview, pos: int, max_level: int, encoding: int) -> int:
    """Skip one RLE level section of a v1 data page (a 4-byte length, then the runs)."""
    if max_level == 0:
        return pos
    if encoding != RLE:
        raise UnsupportedLayoutError(f"level encoding {encoding}")
    size = int.from_bytes(page[pos:pos + 4], "little")
    return pos + 4 + size


def iter_vector_pages(source: Any, chunk: pq.ColumnChunkMetaData, rows: int,
                      column: VectorColumn, read_buffer: np.ndarray | None = None
                      ) -> Iterator[np.ndarray]:
    """The values of one row group's column chunk, page by page, in order.

    Each item is a flat array of ``column.dtype`` (a view of the decompressed page, so
    consume it before asking for the next); together they are the row-major
    ``[rows, dim]`` matrix, cut wherever the writer cut pages (not always on a row
    boundary). Raises ``UnsupportedLayoutError`` - possibly after some pages, so a
    consumer must be able to start over with pyarrow - for anything outside the layout
    described in the module docstring, a codec error or a malformed header included.
    A page that fails its recorded CRC raises ``CorruptPageError`` instead: no fallback.
    ``read_buffer`` (flat uint8) receives the chunk's bytes when it is large enough: a
    reader that reuses one per thread saves the page faults of a fresh chunk-sized
    ``bytes`` per call. Reading into it seeks ``source``,
    so each thread needs its own file handle; without it, ``read_at`` is used.
    """
    try:
        yield from _pages(source, chunk, rows, column, read_buffer)
    except (OSError, ValueError, IndexError) as error:
        raise UnsupportedLayoutError(str(error)) from error


def read_range(source: Any, offset: int, size: int, buffer: np.ndarray | None) -> Any:
    """``size`` bytes at ``offset``: into ``buffer`` when it is big enough, else fresh."""
    if buffer is not None and buffer.dtype == np.uint8 and len(buffer) >= size:
        target = memoryview(buffer)[:size]
        source.seek(offset)
        filled = 0
        while filled < size:
            got = source.readinto(target[filled:])
            if not got:
                break
            filled += got
        return target[:filled]
    return source.read_at(size, offset)


def page_bodies(data: Any, start: int, header_fields: dict[int, Any]
                ) -> Iterator[tuple[dict[int, Any], memoryview]]:
    """Each page of a column chunk's bytes ``data`` (read from file offset ``start``):
    its header and its (still compressed) body, the body's CRC checked when the writer
    recorded one. Index pages are skipped."""
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        header, pos = page_header(data, pos, header_fields)
        compressed_size, size = header.get(3, -1), header.get(2, -1)
        if compressed_size < 0 or size < 0 or pos + compressed_size > len(data):
            raise UnsupportedLayoutError("bad page sizes")
        body = view[pos:pos + compressed_size]
        pos += compressed_size
        if 4 in header and zlib_ng.crc32(body) != header[4] & 0xFFFFFFFF:
            raise CorruptPageError(f"page CRC mismatch in column chunk at byte {start}: "
                                   "the file is corrupt")
        if header.get(1) != INDEX_PAGE:
            yield header, body


def data_page_values(header: dict[int, Any], body: memoryview, codec: Any, column: Any,
                     encodings: tuple[int, ...]) -> tuple[memoryview, int]:
    """A data page's value section (decompressed, its level sections skipped) and its level
    count, for a ``column`` (its ``max_repetition_level`` and ``max_definition_level``)
    whose values are stored in one of ``encodings``. Another page type or encoding, or a
    V2 page with nulls, raises ``UnsupportedLayoutError``."""
    kind, size = header.get(1), header.get(2, -1)
    if kind == DATA_PAGE:
        page = header.get(5, {})
        if page.get(2) not in encodings:
            raise UnsupportedLayoutError("value encoding")
        raw = body if codec is None else memoryview(
            codec.decompress(body, decompressed_size=size, asbytes=False))
        start = _skip_v1_levels(raw, 0, column.max_repetition_level, page.get(4, -1))
        start = _skip_v1_levels(raw, start, column.max_definition_level, page.get(3, -1))
        return raw[start:], page.get(1, -1)
    if kind == DATA_PAGE_V2:
        page = header.get(8, {})
        if page.get(4) not in encodings or page.get(2, -1) != 0:
            raise UnsupportedLayoutError("value encoding or nulls")
        skip = page.get(5, -1) + page.get(6, -1)
        if skip < 0 or skip > len(body):
            raise UnsupportedLayoutError("bad level sizes")
        values = body[skip:]
        if codec is not None and page.get(7, True):
            values = memoryview(codec.decompress(values, decompressed_size=size - skip,
                                                 asbytes=False))
        return values, page.get(1, -1)
    raise UnsupportedLayoutError(f"page type {kind}")


def _pages(source: Any, chunk: pq.ColumnChunkMetaData, rows: int, column: VectorColumn,
           read_buffer: np.ndarray | None) -> Iterator[np.ndarray]:
    _check_chunk(chunk, column)
    codec = page_codec(chunk.compression)
    itemsize = column.dtype.itemsize
    total = rows * column.dim
    if chunk.num_values != total:
        raise UnsupportedLayoutError("value count differs from rows * dim")
    data = read_range(source, chunk.data_page_offset, chunk.total_compressed_size,
                       read_buffer)
    if len(data) != chunk.total_compressed_size:
        raise UnsupportedLayoutError("short read")
    dtype = column.dtype
    filled = 0
    for header, body in page_bodies(data, chunk.data_page_offset, PAGE_HEADER_FIELDS):
        # a dictionary page, or something newer, is refused here
        values, levels = data_page_values(header, body, codec, column, (PLAIN,))
        count = len(values) // itemsize
        # As many values as levels: no null list and no null value on this page.
        if len(values) % itemsize or count != levels or filled + count > total:
            raise UnsupportedLayoutError("nulls or a ragged page")
        if count:
            array = np.frombuffer(values, dtype)
            yield array if dtype.isnative else array.astype(dtype.newbyteorder("="))
        filled += count
    if filled != total:
        raise UnsupportedLayoutError("value count differs from rows * dim")


def read_vector_column(source: Any, metadata: pq.FileMetaData, row_group: int,
                       column: VectorColumn) -> np.ndarray | None:
    """One row group's ``[rows, dim]`` values of a vector column, or None to fall back to
    pyarrow (which reads it, or reports what is wrong with it)."""
    group = metadata.row_group(row_group)
    rows = group.num_rows
    out = np.empty(rows * column.dim, column.dtype.newbyteorder("="))
    filled = 0
    try:
        for values in iter_vector_pages(source, group.column(column.leaf), rows, column):
            out[filled:filled + len(values)] = values
            filled += len(values)
    except UnsupportedLayoutError:
        return None
    return out.reshape(rows, column.dim)
