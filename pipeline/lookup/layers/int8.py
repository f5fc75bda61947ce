"""Direct decoding and mixing of int8 layer columns: the int8 half of mix on read.

The pipeline writes an int8 layer as a Parquet list of INT32 values (``INT(8, signed)``)
in dictionary-encoded pages: a dictionary page of at most 255 PLAIN INT32 values, then
data pages whose value section is the RLE / bit-packing hybrid of dictionary indices
(8 bits each once the dictionary holds more than 128 values). pyarrow decodes such a
column through its general nested reader (a repetition and a definition level per value,
then list offsets and a copy to float32 per layer): about 40k rows/s per 1024-d layer.

Here a column chunk is read the way ``pipeline.lookup.layers.parquet`` reads float16:
page headers parsed in Python, each page's CRC checked, pages decompressed with
pyarrow's codec, the level sections skipped (the chunk's checks guarantee no nulls).
The hybrid runs are decoded by a compiled loop (numba) that looks each index up in the
chunk's dictionary, giving the int8 values, and ``mix_int8`` then computes the mix row
by row in one pass over the output: for each used layer, ``float32(value) * scale``
(``schemas.layers.dequantize_int8``) times the layer's weight, added in
``pipeline.lookup.layers.mixes.accumulate``'s order, so the result is bitwise the reference's.
Looking the dictionary up while decoding (a byte per value) leaves the mix loop free of
gathers, so the compiler vectorizes it: about 3x the loop that looked up float32 values.
Any other layout raises ``UnsupportedLayoutError`` and the caller reads the row group
with pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.lookup.layers.parquet import (
    PAGE_HEADER_FIELDS,
    UnsupportedLayoutError,
    data_page_values,
    fixed_size_list_leaves,
    page_bodies,
    page_codec,
    read_range,
)
from schemas.thrift_compact import DICTIONARY_PAGE, PLAIN, PLAIN_DICTIONARY, RLE_DICTIONARY

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

_DICTIONARY_ENCODINGS = (RLE_DICTIONARY, PLAIN_DICTIONARY)  # of a data page's indices
# PageHeader field 7: DictionaryPageHeader (num_values, encoding).
INT8_PAGE_HEADER_FIELDS: dict[int, Any] = {**PAGE_HEADER_FIELDS, 7: {1: True, 2: True}}


@dataclass(frozen=True)
class Int8Column:
    """Where one int8 vector column's values are in a file."""

    name: str
    leaf: int  # index among the file's leaf columns
    dim: int
    max_repetition_level: int
    max_definition_level: int


def int8_columns(metadata: pq.FileMetaData, schema: pa.Schema,
                 names: list[str]) -> dict[str, Int8Column]:
    """The columns of ``names`` stored as fixed-size lists of int8 (3-level lists)."""
    import pyarrow as pa

    return {name: Int8Column(name, leaf_index, kind.list_size, leaf.max_repetition_level,
                             leaf.max_definition_level)
            for name, leaf_index, kind, leaf in fixed_size_list_leaves(metadata, schema, names)
            if kind.value_type == pa.int8()}


# --------------------------------------------------------------------------- chunks


def read_int8_values(source: Any, chunk: pq.ColumnChunkMetaData, rows: int,
                     column: Int8Column, values: np.ndarray, read_buffer: np.ndarray | None
                     ) -> None:
    """One row group's values of an int8 column into ``values`` (flat int8, ``rows *
    dim``), looked up in the chunk's dictionary as the runs are decoded.

    Raises ``UnsupportedLayoutError`` for any layout but dictionary pages without nulls,
    ``CorruptPageError`` for a page that fails its recorded CRC."""
    try:
        _read_chunk(source, chunk, rows, column, values, read_buffer)
    except (OSError, ValueError, IndexError) as error:
        raise UnsupportedLayoutError(str(error)) from error


def _read_chunk(source: Any, chunk: pq.ColumnChunkMetaData, rows: int, column: Int8Column,
                values: np.ndarray, read_buffer: np.ndarray | None) -> None:
    from pipeline.lookup.layers import int8_kernels  # numba: imported when an int8 file is read

    if chunk.physical_type != "INT32" or not chunk.has_dictionary_page:
        raise UnsupportedLayoutError("not a dictionary-encoded INT32 chunk")
    if not set(chunk.encodings) <= {"PLAIN", "RLE", "RLE_DICTIONARY", "PLAIN_DICTIONARY"}:
        raise UnsupportedLayoutError(f"encodings {chunk.encodings}")
    codec = page_codec(chunk.compression)
    total = rows * column.dim
    if chunk.num_values != total or len(values) != total:
        raise UnsupportedLayoutError("value count differs from rows * dim")
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = read_range(source, start, chunk.total_compressed_size, read_buffer)
    if len(data) != chunk.total_compressed_size:
        raise UnsupportedLayoutError("short read")
    table: np.ndarray | None = None
    filled = 0
    for header, body in page_bodies(data, start, INT8_PAGE_HEADER_FIELDS):
        if header.get(1) == DICTIONARY_PAGE:
            table = _dictionary(body, codec, header.get(2, -1), header.get(7, {}))
            continue
        if table is None:
            raise UnsupportedLayoutError("data page before the dictionary")
        runs, levels = data_page_values(header, body, codec, column, _DICTIONARY_ENCODINGS)
        if levels < 0 or filled + levels > total or not len(runs):
            raise UnsupportedLayoutError("nulls or a ragged page")
        bit_width = int(runs[0])
        if bit_width > 8:
            raise UnsupportedLayoutError(f"index bit width {bit_width}")
        got = int8_kernels.decode_hybrid(np.frombuffer(runs, np.uint8, offset=1), bit_width,
                                         table, values[filled:filled + levels], levels)
        if got != levels:
            raise UnsupportedLayoutError("fewer indices than levels: nulls or a bad page")
        filled += levels
    if filled != total or table is None:
        raise UnsupportedLayoutError("value count differs from rows * dim")


def _dictionary(body: memoryview, codec: Any, size: int, header: dict[int, Any]
                ) -> np.ndarray:
    """The dictionary page's INT32 values as a 256-entry int8 lookup table."""
    if header.get(2, PLAIN) not in (PLAIN, PLAIN_DICTIONARY):
        raise UnsupportedLayoutError("dictionary encoding")
    raw = body if codec is None else codec.decompress(body, decompressed_size=size,
                                                      asbytes=False)
    values = np.frombuffer(raw, "<i4")
    if len(values) != header.get(1, -1) or len(values) > 256:
        raise UnsupportedLayoutError("dictionary size")
    if len(values) and (values.min() < -128 or values.max() > 127):
        raise UnsupportedLayoutError("dictionary values outside int8")
    table = np.zeros(256, np.int8)
    table[:len(values)] = values
    return table


def mix_int8(out: np.ndarray, dense: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
             dense_weight: float, values: np.ndarray, scales: np.ndarray,
             weights: np.ndarray) -> None:
    """Fill ``out`` (float32 ``[rows, dim]``) with the mix (``int8_kernels.mix_rows``): ``dense``
    (optional, first) int8 ``[types, dim]`` values, their float32 scales and each row's
    type; ``values`` int8 ``[layers, rows, dim]``, ``scales`` float32 ``[layers, rows]``,
    ``weights`` float32 ``[layers]``."""
    if dense is None:
        dense = (np.zeros((0, out.shape[1]), np.int8), np.zeros(0, np.float32),
                 np.zeros(0, np.int64))
    type_values, type_scales, rows = dense
    from pipeline.lookup.layers import int8_kernels  # numba: imported when an int8 file is mixed

    int8_kernels.mix_rows(out, type_values, type_scales, rows.astype(np.int64, copy=False),
                          np.float32(dense_weight), values, scales, weights)
