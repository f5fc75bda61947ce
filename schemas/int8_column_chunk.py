"""Parquet column chunks of an int8 layer, encoded here rather than by pyarrow.

A stored int8 layer is a ``fixed_size_list<int8>[dim]`` column: in Parquet a 3-level
list whose leaf is an INT32 annotated ``INT(8, signed)`` (docs/dataset_format.md). pyarrow
writes it through its general nested writer (a repetition and a definition level per
value, int8 widened to INT32, then a hash-table dictionary): most of a token's write
cost at 1024 values a layer, whatever the codec (BENCHMARKS.md, "int8 layer pages").

Every page of such a column has a fixed shape, so this module writes the bytes directly,
in the same encodings pyarrow chose, which every engine reads:

* one dictionary page: PLAIN INT32 ``-127 .. 127`` (index ``i`` holds ``i - 127``);
* data pages (v1) of whole rows, each: the repetition levels, one RLE run of ``0`` and
  one of ``1`` per row (``0`` starts a row), as the RLE/bit-packing hybrid with its
  4-byte length; the definition levels, one RLE run of the leaf's maximum (no nulls);
  then ``RLE_DICTIONARY`` values: bit width 8 and one bit-packed run whose bytes are
  the indices ``q + 127`` themselves;
* each page compressed on its own (by default not at all: a row's ``dim`` bytes then lie
  in the file as they are, for a sense index to read in place), its CRC-32 (of the
  bytes as stored) in its header.

``encode_chunk`` returns the pages' bytes and the chunk's ``ColumnMetaData`` (as a Thrift
struct, ``schemas.thrift_compact``) for ``schemas.parquet_assembly`` to place in a file.
The quantized values come as dictionary indices (``schemas.layers.quantize_int8_indices``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np
from zlib_ng import zlib_ng

from schemas.layers import INDEX_OFFSET  # dictionary index of value q: q + 127
from schemas.thrift_compact import (
    BOOL,
    CODEC_IDS,
    DATA_PAGE,
    DICTIONARY_PAGE,
    I32,
    I64,
    INT32,
    PLAIN,
    RLE,
    RLE_DICTIONARY,
    STRUCT,
    Struct,
    encode_struct,
    i32,
    i64,
    list_of,
)

DICTIONARY_VALUES = np.arange(-INDEX_OFFSET, INDEX_OFFSET + 1, dtype="<i4")
INDEX_BIT_WIDTH = 8  # 255 dictionary entries


@dataclass(frozen=True)
class ChunkCodec:
    """The compression of an int8 chunk's pages: a pyarrow codec name and level."""

    name: str = "uncompressed"  # what ``elmo`` writes: a row's bytes readable in place
    level: int | None = None

    def __post_init__(self) -> None:
        if self.name not in CODEC_IDS:
            raise ValueError(f"codec {self.name!r}: use one of {', '.join(CODEC_IDS)}")

    @property
    def thrift_id(self) -> int:
        return CODEC_IDS[self.name]

    def compress(self, data: Any) -> Any:
        """``data`` compressed (a buffer), or a copy of it when uncompressed: the caller
        lays every page out in one reused buffer, so the page must not point into it."""
        if self.name == "uncompressed":
            return bytes(memoryview(data))
        return _pyarrow_codec(self.name, self.level).compress(data, asbytes=False)


@cache
def _pyarrow_codec(name: str, level: int | None) -> Any:
    import pyarrow as pa

    return pa.Codec(name, compression_level=level)


@dataclass
class EncodedChunk:
    """One column chunk's bytes (``pieces``, in file order) and what its metadata needs."""

    pieces: list[Any]
    rows: int
    dim: int
    data_pages: int
    compressed_size: int  # page headers included, as ColumnMetaData counts them
    uncompressed_size: int
    dictionary_size: int  # the dictionary page, header included: data pages start after it


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _rle_run(count: int, value: int, bit_width: int) -> bytes:
    """One RLE run of the hybrid encoding: ``count`` times ``value``."""
    return _varint(count << 1) + value.to_bytes((bit_width + 7) // 8, "little")


def _level_section(runs: bytes) -> bytes:
    """A v1 page's level section: the 4-byte length, then the hybrid runs."""
    return len(runs).to_bytes(4, "little") + runs


def repetition_levels(rows: int, dim: int, max_level: int) -> bytes:
    """The level section of ``rows`` fixed-size lists of ``dim`` values: per row a run
    of one ``0`` (a new row) and one of ``dim - 1`` ones, repeated as bytes."""
    width = max_level.bit_length()
    if dim == 1:
        return _level_section(_rle_run(rows, 0, width) if rows else b"")
    return _level_section((_rle_run(1, 0, width) + _rle_run(dim - 1, 1, width)) * rows)


def definition_levels(values: int, max_level: int) -> bytes:
    """Every value defined: one RLE run of the maximum level."""
    width = max_level.bit_length()
    return _level_section(_rle_run(values, max_level, width) if values else b"")


def _page_header(kind: int, uncompressed: int, compressed: int, crc: int, body: Struct
                 ) -> bytes:
    signed_crc = crc - (1 << 32) if crc >= 1 << 31 else crc
    field = 5 if kind == DATA_PAGE else 7
    return encode_struct({1: i32(kind), 2: i32(uncompressed), 3: i32(compressed),
                          4: i32(signed_crc), field: (STRUCT, body)})


@lru_cache(maxsize=16)
def dictionary_page(codec: ChunkCodec) -> tuple[bytes, bytes]:
    """The constant dictionary page of every int8 chunk: (header, compressed body)."""
    raw = DICTIONARY_VALUES.tobytes()
    body = bytes(codec.compress(raw))
    header = _page_header(DICTIONARY_PAGE, len(raw), len(body), zlib_ng.crc32(body),
                          {1: i32(len(DICTIONARY_VALUES)), 2: i32(PLAIN),
                           3: (BOOL, False)})
    return header, body


def _data_page(indices: np.ndarray, max_rep: int, max_def: int, codec: ChunkCodec,
               scratch: np.ndarray) -> tuple[bytes, Any, int]:
    """One data page of ``indices`` (``[rows, dim]`` uint8): (header, body, raw size).
    The uncompressed page is laid out in ``scratch`` (uint8, large enough)."""
    rows, dim = indices.shape
    count = rows * dim
    groups = (count + 7) // 8
    levels = repetition_levels(rows, dim, max_rep) + definition_levels(count, max_def)
    head = levels + bytes([INDEX_BIT_WIDTH]) + _varint(groups << 1 | 1)
    raw = scratch[:len(head) + groups * 8]
    raw[:len(head)] = np.frombuffer(head, np.uint8)
    raw[len(head):len(head) + count] = indices.reshape(-1)
    raw[len(head) + count:] = 0  # the last group of 8 is padded
    body = codec.compress(raw)
    header = _page_header(DATA_PAGE, raw.nbytes, len(body), zlib_ng.crc32(body),
                          {1: i32(count), 2: i32(RLE_DICTIONARY), 3: i32(RLE), 4: i32(RLE),
                           5: (STRUCT, {})})
    return header, body, raw.nbytes


def encode_chunk(indices: np.ndarray, max_rep: int, max_def: int, codec: ChunkCodec,
                 page_rows: int) -> EncodedChunk:
    """The pages of one column chunk: ``indices`` (``[rows, dim]`` uint8 dictionary
    indices) in data pages of ``page_rows`` rows after the dictionary page. ``max_rep``
    must be 1 (a top-level list); ``max_def`` is the leaf's maximum definition level."""
    if indices.ndim != 2 or indices.dtype != np.uint8:
        raise ValueError("indices must be a [rows, dim] uint8 array")
    if max_rep != 1 or max_def < 1:
        raise ValueError("only a top-level fixed-size list (max repetition level 1)")
    if page_rows < 1:
        raise ValueError("page_rows must be at least 1")
    rows, dim = indices.shape
    dictionary_header, dictionary_body = dictionary_page(codec)
    pieces: list[Any] = [dictionary_header, dictionary_body]
    dictionary_size = len(dictionary_header) + len(dictionary_body)
    compressed = dictionary_size
    uncompressed = len(dictionary_header) + DICTIONARY_VALUES.nbytes
    pages = 0
    # One buffer for every page's uncompressed bytes: levels (a few bytes a row), values.
    scratch = np.empty(min(rows, page_rows) * (dim + 16) + 64, np.uint8)
    for start in range(0, rows, page_rows):
        header, body, raw_size = _data_page(indices[start:start + page_rows], max_rep,
                                            max_def, codec, scratch)
        pieces += [header, body]
        compressed += len(header) + len(body)
        uncompressed += len(header) + raw_size
        pages += 1
    return EncodedChunk(pieces, rows, dim, pages, compressed, uncompressed, dictionary_size)


def column_metadata(chunk: EncodedChunk, path: list[str], codec: ChunkCodec, offset: int,
                    max_def: int) -> Struct:
    """The ``ColumnChunk`` struct of ``chunk`` written at file ``offset``: what pyarrow
    records for the same column (encodings, encoding stats, level histograms)."""
    values = chunk.rows * chunk.dim
    meta: Struct = {
        1: i32(INT32),
        2: list_of(I32, [PLAIN, RLE, RLE_DICTIONARY]),
        3: list_of(8, [p.encode() for p in path]),
        4: i32(codec.thrift_id),
        5: i64(values),
        6: i64(chunk.uncompressed_size),
        7: i64(chunk.compressed_size),
        9: i64(offset + chunk.dictionary_size),
        11: i64(offset),
        13: list_of(STRUCT, [{1: i32(DICTIONARY_PAGE), 2: i32(PLAIN), 3: i32(1)},
                             {1: i32(DATA_PAGE), 2: i32(RLE_DICTIONARY),
                              3: i32(chunk.data_pages)}]),
        16: (STRUCT, {2: list_of(I64, [chunk.rows, values - chunk.rows]),
                      3: list_of(I64, [0] * max_def + [values])}),
    }
    return {2: i64(0), 3: (STRUCT, meta)}
