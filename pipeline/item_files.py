"""An item's Parquet files in staging: written through a hashing file, so the commit
record carries each file's size and sha256 without reading it back (pipeline/commit.py
checks them), at the final name under a private prefix."""

from __future__ import annotations

import hashlib
import posixpath
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.store import STAGING_DIR
from schemas import PARTITION_COLUMN, TABLE_SCHEMAS, token_schema

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
    for name in schema.names:
        leaf = f"{name}.list.element" if name.startswith("layer_") else name
        codecs[leaf] = "snappy" if name.startswith("layer_") and name != "layer_0" else "zstd"
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
    """Token rows of one item into one Parquet file, in row groups of ~64 MB."""

    def __init__(self, files: ItemFiles, n_output_layers: int, dim: int, dtype: str) -> None:
        self.files = files
        self.schema = token_schema(n_output_layers, dim, dtype)
        layer_bytes = n_output_layers * dim * (2 if dtype == "float16" else 4)
        self.rows_per_group = max(1024, ROW_GROUP_BYTES // max(1, layer_bytes))
        self.handle: _HashingFile | None = None
        self.writer: Any = None
        self.buffer: list[Any] = []
        self.buffered = 0
        self.rows = 0

    def add(self, table: Any) -> None:
        self.buffer.append(table)
        self.buffered += table.num_rows
        if self.buffered >= self.rows_per_group:
            self._flush()

    def _flush(self) -> None:
        if not self.buffer:
            return
        if self.writer is None:
            self.handle = self.files.open("tokens")
            self.writer = pq.ParquetWriter(
                self.handle, self.schema, compression=token_file_compression(self.schema),
                # Dictionary-encoding float16 lists is 2-4x slower to write and 6-10x to read.
                use_dictionary=["doc_id", "token"],
                write_statistics=["doc_id", "sent_idx", "tok_idx", "char_start", "char_end"],
                write_page_checksum=True,  # readers check each page's CRC (dataset_format.md)
            )
        table = pa.concat_tables(self.buffer).cast(self.schema)
        self.writer.write_table(table, row_group_size=self.rows_per_group)
        self.rows += table.num_rows
        self.buffer, self.buffered = [], 0

    def finish(self) -> int:
        self._flush()
        if self.writer is not None:
            self.writer.close()
            self.files.closed("tokens", self.handle)  # type: ignore[arg-type]
        return self.rows


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
