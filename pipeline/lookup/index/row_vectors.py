"""Where a compact index's shard finds each row's int8 vector: one ``RowFile`` either way,
a file mapped for the call and a byte offset a row.

- **In place** (``vector_rows.npy`` + ``vector_source.json``): the dataset's own int8
  layer pages. A one-layer mix (``top`` by default) re-ranks by the cosine of that
  layer's stored int8 values, which a cosine needs no scale for; where the layer's column
  chunks are uncompressed, each row's ``dim`` bytes (dictionary indices ``q + 127``,
  ``schemas.int8_column_chunk``) lie contiguous in a data page, so the build records each
  index row's byte offset in the dataset file (8 bytes a row instead of ``dim``) and the
  file's identity (size, modification time, CRC-32 of its Parquet footer), checked when
  the index opens: a dataset file rewritten under the index stops the search with the
  rebuild command instead of reading wrong bytes.
- **A copy** (``vectors.npy``): the mixed vectors quantized to int8 in the shard. Used
  for mixes of several layers (a sum of layers is not any page's bytes), datasets whose
  pages are compressed (written before 2026-11-29, or by other writers), and datasets
  not on local disk.

Both give the same bytes for a one-layer mix (each row requantized to its largest value
is the stored row: ``tests/lookup/test_index_in_place.py``).
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError
from schemas.int8_limits import INDEX_OFFSET  # a dictionary index is q + 127

if TYPE_CHECKING:
    from schemas.dataset import Dataset
    from schemas.mix_specs import Mix

VECTORS_FILE = "vectors.npy"
VECTOR_ROWS_FILE = "vector_rows.npy"
VECTOR_SOURCE_FILE = "vector_source.json"
# A shard holds one of these: its own copy, or offsets into the dataset and its identity.
COPY_FILES = (VECTORS_FILE,)
IN_PLACE_FILES = (VECTOR_ROWS_FILE, VECTOR_SOURCE_FILE)


@dataclass
class RowFile:
    """One shard's vectors: ``path`` holds row ``i``'s ``dim`` bytes at ``offsets[i]``
    (a mapped array), or at ``start + i * dim`` when ``offsets`` is None (a copy);
    stored bytes minus ``bias`` (mod 256) are the int8 values."""

    path: str
    rows: int
    start: int = 0
    offsets: np.ndarray | None = None
    bias: int = 0

    def byte_offsets(self, local: np.ndarray, dim: int) -> np.ndarray:
        if self.offsets is None:
            return self.start + local.astype(np.int64) * dim
        return np.asarray(self.offsets[local], np.int64)


def open_row_file(folder: str, rows: int, dim: int) -> RowFile:
    """The ``RowFile`` of the shard in ``folder`` (``rows`` rows of ``dim``). A dataset
    file changed since the build raises ``ValueError`` naming it (``ShardedIvf`` adds the
    rebuild command)."""
    source_path = f"{folder}/{VECTOR_SOURCE_FILE}"
    if not os.path.exists(source_path):
        path = f"{folder}/{VECTORS_FILE}"
        mapped = np.load(path, mmap_mode="r")
        if mapped.shape != (rows, dim):
            raise ValueError(f"{path}: {mapped.shape}, expected {(rows, dim)}")
        return RowFile(path, rows, int(mapped.offset))
    with open(source_path) as handle:
        source = json.load(handle)
    offsets = np.load(f"{folder}/{VECTOR_ROWS_FILE}", mmap_mode="r")
    if offsets.shape != (rows,) or int(source["dim"]) != dim:
        raise ValueError(f"{folder}/{VECTOR_ROWS_FILE}: {offsets.shape}, expected ({rows},)")
    if not os.path.exists(source["path"]):
        raise ValueError(f"dataset file {source['path']} is not readable (moved or removed): "
                         "the index reads its vectors in place")
    if file_identity(source["path"]) != source["identity"]:
        raise ValueError(f"dataset file {source['path']} changed since the index was built: "
                         "the index reads its vectors in place")
    return RowFile(source["path"], rows, 0, offsets, int(source["bias"]))


def file_identity(path: str) -> dict[str, int]:
    """Size, modification time and the CRC-32 of the Parquet footer of ``path``."""
    stat = os.stat(path)
    with open(path, "rb") as handle:
        tail = min(stat.st_size, 8)
        handle.seek(stat.st_size - tail)
        end = handle.read(tail)
        footer = int.from_bytes(end[:4], "little") if tail == 8 else 0
        handle.seek(max(0, stat.st_size - 8 - footer))
        crc = zlib.crc32(handle.read(min(footer, stat.st_size - 8) + 8 if tail == 8 else 0))
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "footer_crc32": crc}


def in_place_layer(ds: Dataset, mix: Mix) -> str | None:
    """The layer column a mix's vectors can be read from in place, or None: a mix of one
    stored layer, scaled by a positive weight (a cosine ignores it), without token norm,
    in a dataset on local disk."""
    from schemas.dataset import is_local

    used = mix.used_layers
    if len(used) != 1 or mix.token_norm or mix.gamma <= 0 or used[0] == 0 \
            or not is_local(ds.fs):
        return None  # layer 0 may live in the types file, once per token type
    return f"layer_{used[0]}"


def write_in_place(folder: str, ds: Dataset, mix: Mix, path: str,
                   wanted: np.ndarray) -> bool:
    """Record where the rows ``wanted`` (the file's row numbers, ascending) of the dataset
    file ``path`` keep their vectors, if the layout lets them be read in place; False
    (nothing written) where a copy is needed."""
    column = in_place_layer(ds, mix)
    if column is None:
        return False
    pages = uncompressed_row_pages(path, column)
    if pages is None:
        return False
    first_rows, value_offsets, dim, total = pages
    if dim != ds.descriptor.dim:
        return False
    if len(wanted) and int(wanted[-1]) >= total:
        raise ElmoUserError(f"{path} holds {total} rows; the index's rows of it point past "
                            "them: rebuild the index with --rebuild")
    page = np.searchsorted(first_rows, wanted, side="right") - 1
    offsets = value_offsets[page] + (wanted - first_rows[page]) * dim
    np.save(f"{folder}/{VECTOR_ROWS_FILE}", offsets.astype(np.int64))
    source = {"path": os.path.abspath(path), "column": column, "dim": dim,
              "bias": INDEX_OFFSET, "identity": file_identity(path)}
    with open(f"{folder}/{VECTOR_SOURCE_FILE}", "w") as handle:
        json.dump(source, handle)
    return True


def uncompressed_row_pages(path: str, column: str
                           ) -> tuple[np.ndarray, np.ndarray, int, int] | None:
    """For an int8 layer ``column`` of ``path`` whose every column chunk is uncompressed
    dictionary pages (the identity dictionary ``-127..127``) with one bit-packed run of
    8-bit indices a page over whole rows: each data page's first row, the file offset of
    its values, the width and the file's rows. None for any other layout."""
    import pyarrow.parquet as pq

    from pipeline.lookup.layers.int8 import int8_columns
    from pipeline.lookup.layers.parquet import UnsupportedLayoutError

    with open(path, "rb") as handle:
        meta = pq.ParquetFile(handle).metadata
        found = int8_columns(meta, meta.schema.to_arrow_schema(), [column])
        if column not in found:
            return None
        layout = found[column]
        first_rows: list[int] = []
        offsets: list[int] = []
        row = 0
        try:
            for group in range(meta.num_row_groups):
                chunk = meta.row_group(group).column(layout.leaf)
                if chunk.compression != "UNCOMPRESSED" or not chunk.has_dictionary_page:
                    return None
                if not _chunk_pages(handle, chunk, layout, row, first_rows, offsets):
                    return None
                row += meta.row_group(group).num_rows
        except (UnsupportedLayoutError, ValueError, IndexError):
            return None
    return (np.array(first_rows, np.int64), np.array(offsets, np.int64), layout.dim,
            meta.num_rows)


def _chunk_pages(handle: Any, chunk: Any, layout: Any, row: int, first_rows: list[int],
                 offsets: list[int]) -> bool:
    """Append each data page's first row and values' file offset of one column chunk;
    False where the layout is not the in-place one."""
    from pipeline.lookup.layers.int8 import INT8_PAGE_HEADER_FIELDS
    from pipeline.lookup.layers.parquet import data_page_values, page_bodies
    from schemas.int8_column_chunk import DICTIONARY_VALUES, INDEX_BIT_WIDTH
    from schemas.thrift_compact import DICTIONARY_PAGE, RLE_DICTIONARY, read_varint

    start = chunk.dictionary_page_offset or chunk.data_page_offset
    handle.seek(start)
    data = handle.read(chunk.total_compressed_size)
    base = np.frombuffer(data, np.uint8).__array_interface__["data"][0]
    seen = 0
    for header, body in page_bodies(data, start, INT8_PAGE_HEADER_FIELDS):
        if header.get(1) == DICTIONARY_PAGE:
            if not np.array_equal(np.frombuffer(body, "<i4"), DICTIONARY_VALUES):
                return False
            continue
        values, levels = data_page_values(header, body, None, layout, (RLE_DICTIONARY,))
        raw = np.frombuffer(values, np.uint8)
        if levels % layout.dim or len(raw) < 2 or raw[0] != INDEX_BIT_WIDTH:
            return False
        run, width = read_varint(memoryview(raw), 1)
        if not run & 1 or (run >> 1) * 8 < levels or len(raw) < width + levels:
            return False  # not one bit-packed run over the page's values
        first_rows.append(row + seen // layout.dim)
        offsets.append(start + raw.__array_interface__["data"][0] - base + width)
        seen += levels
    return seen == chunk.num_values
