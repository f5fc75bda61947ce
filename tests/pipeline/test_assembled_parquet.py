"""The int8 layers' own page encoder against the reference writer (pyarrow).

``TokenWriter(encoder="assembled")`` (the default) writes the int8 layer columns' pages
with ``schemas.int8_column_chunk`` and the rest with pyarrow; ``encoder="pyarrow"`` is
the reference. For several shapes (one row, a dimension of 1, many pages, many row
groups) both files must read back as equal tables through pyarrow and DuckDB, and our
direct page reader must give the same int8 values; a flipped byte in a page must fail
its CRC. The Thrift codec and the quantizer are checked against what they stand for.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline.write.item_files as item_files
from pipeline.lookup.layers.int8 import int8_columns, read_int8_values
from pipeline.lookup.layers.parquet import CorruptPageError
from pipeline.write.item_files import TokenWriter
from schemas import token_schema
from schemas.int8_column_chunk import ChunkCodec, definition_levels, repetition_levels
from schemas.layers import quantize_int8, quantize_int8_indices, quantize_int8_into
from schemas.parquet_assembly import AssembledParquetWriter
from schemas.thrift_compact import (
    DATA_PAGE,
    DICTIONARY_PAGE,
    PLAIN,
    RLE_DICTIONARY,
    encode_struct,
    read_struct,
)


class DirFiles:
    """``ItemFiles`` for a test: each table's file in a folder, closed and sized."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.sizes: dict[str, int] = {}

    def open(self, table: str) -> Any:
        return (self.folder / f"{table}.parquet").open("wb")

    def closed(self, table: str, handle: Any) -> None:
        handle.close()
        self.sizes[table] = (self.folder / f"{table}.parquet").stat().st_size


def _units(rows: int, n_out: int, dim: int, unit: int, seed: int = 0) -> list[pa.Table]:
    """Float token rows as ``rows_of_unit`` makes them, cut into tables of ``unit`` rows;
    layer 0 repeats per token string (context free) and is ``[x; x]`` when dim is even."""
    rng = np.random.default_rng(seed)
    words = [f"w{i % 37}" for i in range(rows)]
    word_vectors = rng.normal(size=(37, dim)).astype(np.float32)
    if dim % 2 == 0:
        word_vectors[:, dim // 2:] = word_vectors[:, : dim // 2]
    tables = []
    for start in range(0, rows, unit):
        n = min(unit, rows - start)
        columns: dict[str, Any] = {
            "doc_id": pa.array([f"d{(start + i) // 50}" for i in range(n)]),
            "sent_idx": pa.array(np.arange(start, start + n, dtype=np.int32) // 10),
            "tok_idx": pa.array(np.arange(start, start + n, dtype=np.int32) % 10),
            "token": pa.array(words[start:start + n]),
            "char_start": pa.array(np.arange(start, start + n, dtype=np.int32) * 3),
            "char_end": pa.array(np.arange(start, start + n, dtype=np.int32) * 3 + 2),
        }
        for k in range(n_out):
            x = (word_vectors[[int(w[1:]) for w in words[start:start + n]]] if k == 0 else
                 rng.normal(size=(n, dim)).astype(np.float32)
                 * rng.uniform(0.01, 30, size=(n, 1)).astype(np.float32))
            if k == 1 and n > 2:
                x[1] = 0.0  # an all-zero vector: scale 0
            columns[f"layer_{k}"] = pa.FixedSizeListArray.from_arrays(
                pa.array(x.reshape(-1), pa.float32()), dim)
        tables.append(pa.table(columns))
    return tables


def _write_both(tmp_path: Path, tables: list[pa.Table], n_out: int, dim: int
                ) -> dict[str, DirFiles]:
    out = {}
    for encoder in ("assembled", "pyarrow"):
        files = DirFiles(tmp_path / encoder)
        writer = TokenWriter(files, n_out, dim, "int8", encoder=encoder)  # type: ignore[arg-type]
        for table in tables:
            writer.add(table)
        writer.finish()
        out[encoder] = files
    return out


def _own_reader_values(path: Path) -> dict[str, np.ndarray]:
    """Every int8 column through ``pipeline.lookup.layers.int8`` (the read side's pages)."""
    parquet = pq.ParquetFile(path)
    names = [f.name for f in parquet.schema_arrow if pa.types.is_fixed_size_list(f.type)]
    out = {}
    with pa.OSFile(str(path)) as source:
        for name, column in int8_columns(parquet.metadata, parquet.schema_arrow, names).items():
            parts = []
            for g in range(parquet.metadata.num_row_groups):
                rows = parquet.metadata.row_group(g).num_rows
                values = np.empty(rows * column.dim, np.int8)
                read_int8_values(source, parquet.metadata.row_group(g).column(column.leaf),
                                 rows, column, values, None)
                parts.append(values.reshape(rows, column.dim))
            out[name] = np.concatenate(parts)
    return out


SHAPES = [  # rows, output layers, dim, unit rows, rows per row group, bytes per page
    (1, 3, 8, 16, 1024, 1 << 20),
    (5, 2, 1, 3, 2, 1 << 20),
    (2100, 2, 1, 300, 2, 1 << 20),
    (3000, 3, 64, 700, 1024, 1000),
    (2500, 3, 1024, 1000, 1024, 1 << 20),
    (257, 3, 7, 64, 100, 50),
]


@pytest.mark.slow
@pytest.mark.parametrize(("rows", "n_out", "dim", "unit", "group_rows", "page_bytes"), SHAPES,
                         ids=[f"{s[0]}x{s[1]}x{s[2]}" for s in SHAPES])
def test_assembled_files_read_back_as_the_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int, n_out: int, dim: int,
        unit: int, group_rows: int, page_bytes: int) -> None:
    monkeypatch.setattr(item_files, "PAGE_BYTES", page_bytes)
    monkeypatch.setattr(item_files, "ROW_GROUP_BYTES", group_rows * n_out * dim)
    files = _write_both(tmp_path, _units(rows, n_out, dim, unit), n_out, dim)
    assert set(files["assembled"].sizes) == set(files["pyarrow"].sizes) == {"tokens", "types"}
    for table in ("tokens", "types"):
        fast, reference = (files[e].folder / f"{table}.parquet" for e in ("assembled", "pyarrow"))
        want = pq.read_table(reference)
        got = pq.read_table(fast, page_checksum_verification=True)
        assert got.schema == want.schema  # the Arrow schema (and its metadata) pyarrow keeps
        assert got.equals(want)
        meta = pq.ParquetFile(fast).metadata
        assert meta.num_rows == want.num_rows
        assert meta.schema.equals(pq.ParquetFile(reference).metadata.schema)
        if table == "tokens":
            assert meta.num_row_groups == -(-rows // max(1024, group_rows))  # at least 1024
        with duckdb.connect() as con:
            query = "select * from read_parquet(?) order by all"
            assert (con.execute(query, [str(fast)]).fetchall()
                    == con.execute(query, [str(reference)]).fetchall())
        own, theirs = _own_reader_values(fast), _own_reader_values(reference)
        assert own.keys() == theirs.keys() and own
        for name in own:
            assert np.array_equal(own[name], theirs[name])


def test_many_pages_in_a_row_group_and_their_size(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(item_files, "PAGE_BYTES", 10 * 64)
    files = _write_both(tmp_path, _units(300, 3, 64, 300), 3, 64)
    path = files["assembled"].folder / "tokens.parquet"
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(6)  # layer_1.list.element
    assert chunk.path_in_schema == "layer_1.list.element"
    assert set(chunk.encodings) == {"PLAIN", "RLE", "RLE_DICTIONARY"}
    data = path.read_bytes()
    pos, pages = chunk.dictionary_page_offset, {}
    while pos < chunk.dictionary_page_offset + chunk.total_compressed_size:
        header, pos = read_struct(data, pos)
        pos += header[3][1]
        kind, encoding = header[1][1], (header[7][1] if 7 in header else header[5][1])[2][1]
        pages[kind, encoding] = pages.get((kind, encoding), 0) + 1
    assert pages == {(DICTIONARY_PAGE, PLAIN): 1, (DATA_PAGE, RLE_DICTIONARY): 30}  # 10 rows a page
    # Each page its own bytes (uncompressed pages, the default, once shared one buffer).
    assert pq.read_table(path, page_checksum_verification=True).equals(
        pq.read_table(files["pyarrow"].folder / "tokens.parquet"))
    # The footer's encoding_stats (which pyarrow does not show) count the same pages.
    footer_size = int.from_bytes(data[-8:-4], "little")
    footer, _ = read_struct(data, len(data) - 8 - footer_size)
    column = footer[4][1][1][0][1][1][1][6]  # row_groups[0].columns[6]
    stats = column[3][1][13][1][1]  # meta_data.encoding_stats
    assert {(s[1][1], s[2][1]): s[3][1] for s in stats} == pages


def test_empty_and_one_row_files(tmp_path: Path) -> None:
    schema = token_schema(3, 16, "int8")
    sink = io.BytesIO()
    writer = AssembledParquetWriter(sink, schema, {}, ChunkCodec("zstd"), 4)
    writer.close()
    (tmp_path / "empty.parquet").write_bytes(sink.getvalue())
    table = pq.read_table(tmp_path / "empty.parquet")
    assert table.num_rows == 0 and table.schema == schema
    with duckdb.connect() as con:
        assert con.execute("select count(*) from read_parquet(?)",
                           [str(tmp_path / "empty.parquet")]).fetchone() == (0,)
    files = _write_both(tmp_path, _units(1, 3, 16, 1), 3, 16)
    one = pq.read_table(files["assembled"].folder / "tokens.parquet")
    assert one.num_rows == 1
    assert one.equals(pq.read_table(files["pyarrow"].folder / "tokens.parquet"))


def test_a_flipped_byte_fails_the_page_crc(tmp_path: Path) -> None:
    files = _write_both(tmp_path, _units(400, 3, 64, 400), 3, 64)
    path = files["assembled"].folder / "tokens.parquet"
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(8)  # layer_2.list.element
    data = bytearray(path.read_bytes())
    data[chunk.dictionary_page_offset + chunk.total_compressed_size - 16] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(OSError, match="CRC"):
        pq.read_table(path, page_checksum_verification=True)
    with pytest.raises(CorruptPageError):
        _own_reader_values(path)


@pytest.mark.parametrize("dim", [1, 5, 64, 1024])
def test_quantize_to_indices_is_the_reference_rule(dim: int) -> None:
    rng = np.random.default_rng(dim)
    x = (rng.normal(size=(300, dim)) * rng.uniform(1e-6, 1e4, size=(300, 1))).astype(np.float32)
    x[0] = 0.0
    x[1] = -0.0
    x[2, 0] = 1e-42  # subnormal
    x[3] = rng.integers(-3, 4, size=dim) * np.float32(0.5)  # exact halves: round half even
    q, scale = quantize_int8(x)
    indices, scales = quantize_int8_indices(x)
    assert np.array_equal(scales.view(np.uint32), scale.view(np.uint32))
    assert np.array_equal(indices.astype(np.int16) - 127, q)
    strided = np.asfortranarray(x)
    assert np.array_equal(quantize_int8_indices(strided)[0], indices)
    values, scales_again = quantize_int8_into(x)
    assert values.dtype == np.int8 and np.array_equal(values, q)
    assert np.array_equal(scales_again.view(np.uint32), scale.view(np.uint32))
    with pytest.raises(ValueError, match="uint8"):
        quantize_int8_indices(x, np.empty(x.shape, np.int8))


def test_thrift_round_trips_pyarrow_footers_and_levels_are_well_formed(tmp_path: Path) -> None:
    files = _write_both(tmp_path, _units(700, 3, 32, 700), 3, 32)
    for path in (files["pyarrow"].folder / "tokens.parquet",
                 files["assembled"].folder / "tokens.parquet"):
        data = path.read_bytes()
        size = int.from_bytes(data[-8:-4], "little")
        footer = data[-8 - size:-8]
        decoded, end = read_struct(footer)
        assert end == len(footer) and encode_struct(decoded) == footer
    # one row of 4 values, max repetition level 1: a run of one 0, then a run of three 1s
    assert repetition_levels(1, 4, 1) == bytes([4, 0, 0, 0, 2, 0, 6, 1])
    assert definition_levels(300, 2) == bytes([3, 0, 0, 0, 0xD8, 0x04, 2])
    schema = token_schema(3, 4, "int8")
    writer = AssembledParquetWriter(io.BytesIO(), schema, {}, ChunkCodec(), 4)
    others = schema.empty_table().drop_columns(writer.int8_names)
    with pytest.raises(ValueError, match="other columns"):
        writer.write_row_group(others.drop_columns(["token"]), {})
    with pytest.raises(ValueError, match="uint8"):
        writer.write_row_group(others, {n: np.zeros((0, 4), np.int8) for n in writer.int8_names})


def _quantized(table: pa.Table) -> pa.Table:
    """``table`` with every layer quantized as a GPU embedder hands it over: int8 values
    and a ``_scale`` column per layer (schemas.layers.quantize_int8)."""
    columns = {}
    for name in table.column_names:
        if not name.startswith("layer_"):
            columns[name] = table.column(name)
            continue
        floats = table.column(name).combine_chunks()
        q, scale = quantize_int8(floats.flatten().to_numpy().reshape(len(floats), -1))
        columns[name] = pa.FixedSizeListArray.from_arrays(pa.array(q.reshape(-1)), q.shape[1])
        columns[name + "_scale"] = pa.array(scale)
    return pa.table(columns)


@pytest.mark.parametrize("encoder", ["assembled", "pyarrow"])
def test_layers_quantized_where_the_model_ran_give_the_same_bytes(tmp_path: Path,
                                                                  encoder: str) -> None:
    tables = _units(1500, 3, 32, 400)
    out = {}
    for kind, units in (("floats", tables), ("int8", [_quantized(t) for t in tables])):
        files = DirFiles(tmp_path / kind)
        writer = TokenWriter(files, 3, 32, "int8", encoder=encoder)  # type: ignore[arg-type]
        for table in units:
            writer.add(table)
        writer.finish()
        out[kind] = {t: (files.folder / f"{t}.parquet").read_bytes() for t in files.sizes}
    assert out["floats"].keys() == {"tokens", "types"}
    assert out["floats"] == out["int8"]


def test_rows_of_unit_quantize_each_window_as_the_writer_would() -> None:
    """int8 units leave ``rows_of_unit`` quantized window by window (no float copy of the
    unit): the same values and scales as quantizing the float rows."""
    from pipeline.write.work_item import WindowRow, rows_of_unit

    rng = np.random.default_rng(5)
    rows, layers = [], []
    for w, n in enumerate((7, 1, 30, 12)):
        toks = [f"t{w}_{i}" for i in range(n)]
        rows.append(WindowRow("d", w, 0, 1 if n > 2 else 0, n - 1 if n > 2 else n, toks,
                              list(range(n)), list(range(1, n + 1))))
        batch = rng.normal(size=(3, n + 5, 16)).astype(np.float32)
        layers.append(batch[:, 2:2 + n])  # a view into a batch, as embed returns
    as_int8 = rows_of_unit(rows, layers, 3, 16, "int8")
    as_float = rows_of_unit(rows, layers, 3, 16, "float32")
    assert as_int8.num_rows == as_float.num_rows == 7 - 2 + 1 + 30 - 2 + 12 - 2
    for k in range(3):
        floats = as_float.column(f"layer_{k}").combine_chunks()
        q, scale = quantize_int8(floats.flatten().to_numpy().reshape(len(floats), 16))
        got = as_int8.column(f"layer_{k}").combine_chunks()
        assert got.type == pa.list_(pa.int8(), 16)
        assert np.array_equal(got.flatten().to_numpy().reshape(-1, 16), q)
        assert np.array_equal(as_int8.column(f"layer_{k}_scale").to_numpy(), scale)
