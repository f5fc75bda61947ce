"""Layer vectors as readers see them, whatever the stored layout (schema version 1-3).

Version 3 stores ``layer_0`` once per distinct token in the ``types`` file beside each
tokens file (only the first half when it is ``[x; x]``), and int8 layers as values plus
a per-vector scale (``schemas.layers``). Every reader of ours (the mixes, the SQL views'
``elmo_mix``, the index, ``elmo mix fit``) goes through here, so each sees every layer
``layer_0 .. layer_L`` as ``[n, dim]`` floats, as in a version 1/2 file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError
from schemas import (
    HALF_LAYER_0,
    PARTITION_COLUMN,
    SCALE_SUFFIX,
    TABLE_SCHEMAS,
    TYPES_SINCE_VERSION,
    layer_columns,
)
from schemas.dataset import open_dataset
from schemas.layers import dequantize_int8

if TYPE_CHECKING:
    import pyarrow as pa


def types_path(tokens_path: str) -> str:
    """The ``types`` file that holds layer 0 of a version 3 tokens file: the same
    ``shard=k/<part>.parquet`` under ``types/`` (docs/dataset_format.md)."""
    head, sep, tail = tokens_path.rpartition("/tokens/")
    if not sep:
        raise ElmoUserError(f"{tokens_path} is not under a tokens/ folder")
    return f"{head}/types/{tail}"


def matrix(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``[n, dim]`` numpy view of a fixed-size-list column (no copy for one chunk)."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks != 1:
            parts = [matrix(c) for c in column.chunks if len(c)]
            dim = column.type.list_size
            return np.concatenate(parts) if parts else np.zeros((0, dim), np.float32)
        column = column.chunk(0)
    if not pa.types.is_fixed_size_list(column.type):
        raise ElmoUserError(f"expected a fixed-size list column of vectors, got {column.type}")
    if column.null_count:
        raise ElmoUserError("layer column holds nulls")
    values = column.flatten().to_numpy(zero_copy_only=True)
    return values.reshape(len(column), column.type.list_size)


def stored_vectors(table: pa.Table | pa.RecordBatch, name: str) -> np.ndarray:
    """Vector column ``name`` as floats: a view of float16/float32 values, or the
    dequantized float32 of int8 values and their ``name_scale`` column."""
    values = matrix(table.column(name))
    if values.dtype != np.int8:
        return values
    scale = table.column(name + SCALE_SUFFIX)
    return dequantize_int8(values, scale.to_numpy(zero_copy_only=False))


@dataclass(frozen=True)
class TypeVectors:
    """The ``types`` file of one tokens file: each distinct token and its layer 0."""

    tokens: Any  # pa.Array of strings
    layer_0: np.ndarray  # [n_types, dim], float16/float32 as stored, float32 from int8
    # int8 files: layer 0 as stored, [n_types, dim] values and [n_types] scales, for
    # readers that dequantize as they go (``pipeline.lookup.layers.int8``).
    stored_int8: tuple[np.ndarray, np.ndarray] | None = None

    def rows_for(self, tokens: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The row of ``layer_0`` of each of ``tokens`` (a column of the tokens file,
        plain or dictionary-encoded: then only its distinct strings are looked up, far
        fewer than hashing every row's string)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if isinstance(tokens, pa.ChunkedArray):
            parts = [self.rows_for(chunk) for chunk in tokens.chunks]
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)
        if pa.types.is_dictionary(tokens.type):
            distinct = self.rows_for(tokens.dictionary)
            return distinct[tokens.indices.to_numpy(zero_copy_only=False)]
        rows = pc.index_in(tokens, value_set=self.tokens)
        if rows.null_count:
            raise ElmoUserError("a token has no row in its types file (an incomplete dataset)")
        return rows.to_numpy(zero_copy_only=False)

    def for_tokens(self, tokens: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """``[n, dim]`` layer 0 of each of ``tokens`` (a column of the tokens file)."""
        return self.layer_0[self.rows_for(tokens)]


def read_types(fs: Any, tokens_path: str) -> TypeVectors:
    """Read the types file of ``tokens_path`` (``fs``: a pyarrow file system)."""
    import pyarrow.parquet as pq

    path = types_path(tokens_path)
    try:
        table = pq.read_table(path, filesystem=fs)
    except FileNotFoundError:
        raise ElmoUserError(f"{path} is missing: layer 0 of {tokens_path} is stored "
                            "there (schema version 3)") from None
    name = HALF_LAYER_0 if HALF_LAYER_0 in table.column_names else "layer_0"
    layer_0 = stored_vectors(table, name)
    stored_int8 = None
    if name + SCALE_SUFFIX in table.column_names:
        stored_int8 = (matrix(table.column(name)),
                       table.column(name + SCALE_SUFFIX).to_numpy().astype(np.float32))
    if name == HALF_LAYER_0:
        layer_0 = np.concatenate([layer_0, layer_0], axis=1)
        if stored_int8 is not None:
            stored_int8 = (np.concatenate([stored_int8[0], stored_int8[0]], axis=1),
                           stored_int8[1])
    return TypeVectors(table.column("token").combine_chunks(), layer_0, stored_int8)


def file_version(schema: pa.Schema) -> int:
    """The schema version a tokens file was written with (its Arrow schema metadata)."""
    metadata = schema.metadata or {}
    return int(metadata.get(b"elmo_store_schema_version", b"2"))


def has_own_layer_0(schema: pa.Schema) -> bool:
    """Whether a tokens file holds ``layer_0`` itself (versions 1 and 2)."""
    return "layer_0" in schema.names or file_version(schema) < TYPES_SINCE_VERSION


def stored_columns(schema: pa.Schema, layers: list[str]) -> list[str]:
    """The columns of a tokens file to read to get ``layers`` (scales, and ``token``
    for a layer 0 that is in the types file)."""
    out: list[str] = []
    for name in layers:
        if name == "layer_0" and not has_own_layer_0(schema):
            out.append("token")
            continue
        out.append(name)
        if name + SCALE_SUFFIX in schema.names:
            out.append(name + SCALE_SUFFIX)
    return list(dict.fromkeys(out))


def layer_vectors(table: pa.Table | pa.RecordBatch, name: str,
                  types: TypeVectors | None) -> np.ndarray:
    """Layer ``name`` of the rows of ``table`` (read with ``stored_columns``)."""
    if name == "layer_0" and name not in table.column_names:
        if types is None:
            raise ElmoUserError("layer_0 is in the types file, which was not read")
        return types.for_tokens(table.column("token"))
    return stored_vectors(table, name)


def check_layers(schema: pa.Schema, layers: list[str], path: str) -> None:
    """Refuse a tokens file that cannot give ``layers``."""
    missing = [n for n in layers
               if n not in schema.names and not (n == "layer_0" and not has_own_layer_0(schema))]
    if missing:
        raise ElmoUserError(f"{path} has no layer columns {missing}: "
                            f"this dataset stores no layers to mix")


def with_every_layer(table: pa.Table, n_output_layers: int, types: TypeVectors | None
                     ) -> pa.Table:
    """A tokens table (as stored, any version) with ``layer_0 .. layer_L`` as float
    fixed-size lists in the version 1/2 places, and no scale columns: float16/float32 as
    stored, float32 for int8."""
    import pyarrow as pa

    names = [f"layer_{k}" for k in range(n_output_layers)]
    vectors = {n: layer_vectors(table, n, types) for n in names}
    keep = [c for c in table.column_names
            if not c.startswith("layer_") and not c.endswith(SCALE_SUFFIX)]
    at = keep.index("char_end") + 1 if "char_end" in keep else len(keep)
    columns = {c: table.column(c) for c in keep[:at]}
    for name, values in vectors.items():
        flat = pa.array(np.ascontiguousarray(values).reshape(-1))
        columns[name] = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
    columns.update({c: table.column(c) for c in keep[at:]})
    return pa.table(columns)


def read_table(dataset: Any, table: str = "tokens", filters: Any = None) -> pa.Table:
    """Every live row of one table of a dataset (a URI or an opened ``Dataset``) with the
    hive column ``shard``; ``filters`` as ``pyarrow.parquet.read_table`` takes them. The
    tokens table comes with every layer as floats (``with_every_layer``): what
    ``pq.read_table(OUT / "tokens")`` gave for version 1/2 datasets. For small datasets
    and checks; streaming readers use ``pipeline.lookup.layers.mixes.iter_mixed``."""
    import pyarrow as pa

    ds = open_dataset(dataset) if isinstance(dataset, str) else dataset
    # An empty piece may carry another float width (no rows to take it from): leave it.
    pieces = list(iter_table(ds, table, filters))
    rows = [t for t in pieces if t.num_rows] or pieces[:1]
    return pa.concat_tables(rows) if rows else table_schema(ds.descriptor, table).empty_table()


def iter_table(ds: Any, table: str = "tokens", filters: Any = None,
               columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
    """``read_table``'s rows a live file at a time; ``columns``: at least these (a file's
    layers are read whole, with whatever they need, when one is asked for)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs = ds.arrow_filesystem()
    n_layers = ds.descriptor.n_output_layers
    layers = columns is None or any(c.startswith("layer_") for c in columns)
    stored = None if layers or columns is None else \
        [c for c in columns if c != PARTITION_COLUMN]
    for file in ds.shard_files(table):
        piece = pq.read_table(file.path, filesystem=fs, filters=filters, columns=stored)
        if table == "tokens" and layers:
            types = None if has_own_layer_0(piece.schema) else read_types(fs, file.path)
            piece = with_every_layer(piece, n_layers, types)
        yield piece.append_column(
            PARTITION_COLUMN, pa.array([file.shard] * piece.num_rows, pa.int32()))


def table_schema(descriptor: Any, table: str = "tokens") -> pa.Schema:
    """The schema ``read_table`` gives ``table``, with its ``shard`` column."""
    import pyarrow as pa

    schema = _every_layer_schema(descriptor) if table == "tokens" else TABLE_SCHEMAS[table]
    return schema.append(pa.field(PARTITION_COLUMN, pa.int32()))


def _every_layer_schema(descriptor: Any) -> pa.Schema:
    """The tokens table as ``with_every_layer`` gives it, for a dataset with no rows."""
    import pyarrow as pa

    value = pa.float32() if descriptor.dtype == "int8" else pa.from_numpy_dtype(
        np.dtype(descriptor.dtype))
    meta = [f for f in descriptor.token_schema() if not f.name.startswith("layer_")]
    return pa.schema(meta + [pa.field(name, pa.list_(value, descriptor.dim))
                             for name in layer_columns(descriptor.n_output_layers)])
