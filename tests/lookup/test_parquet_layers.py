"""The direct Parquet vector reader against pyarrow, and the threaded mix-on-read around it.

Every layout the pipeline could write is compared bitwise with pyarrow's own decoding;
layouts the direct path does not handle must come back as None (then pyarrow reads
them), never as wrong numbers.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline.lookup.layers.mixes as mixes
from elmo_model import layer_mix
from pipeline.lookup.layers.mixes import iter_mixed, mix_arrays
from pipeline.lookup.layers.parquet import read_vector_column, vector_columns
from pipeline.lookup.layers.tokens import read_types
from schemas.dataset import open_dataset
from schemas.mix_specs import Mix

ROWS, DIM = 3000, 48


def _matrix(dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, DIM)).astype(dtype)
    x[::7] = x[0]  # repeats, so that codecs have something to compress
    return x


def _vector_array(x: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


def _direct(path: Path, name: str = "v") -> list[np.ndarray | None]:
    parquet = pq.ParquetFile(path)
    column = vector_columns(parquet.metadata, parquet.schema_arrow, [name])[name]
    with pa.OSFile(str(path)) as source:
        return [read_vector_column(source, parquet.metadata, g, column)
                for g in range(parquet.metadata.num_row_groups)]


def _pyarrow(path: Path, name: str = "v") -> np.ndarray:
    column = pq.read_table(path, columns=[name]).column(name).combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), -1)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("options", [
    {"compression": "zstd"},
    {"compression": "none"},
    {"compression": "snappy"},
    {"compression": "gzip"},
    {"compression": "brotli"},
    {"compression": "zstd", "data_page_version": "2.0"},
    {"compression": "none", "data_page_version": "2.0"},
    {"compression": "zstd", "data_page_size": 4096, "row_group_size": 700},
    {"compression": "zstd", "write_page_checksum": True, "write_page_index": True},
], ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_direct_reader_equals_pyarrow(tmp_path: Path, dtype: str, options: dict) -> None:
    x = _matrix(dtype)
    table = pa.table({"id": np.arange(ROWS), "v": _vector_array(x),
                      "w": _vector_array(x[::-1].copy())})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, use_dictionary=False, **options)
    for name in ("v", "w"):
        parts = _direct(path, name)
        assert all(p is not None for p in parts)
        got = np.concatenate(parts)  # type: ignore[arg-type]
        assert got.dtype == np.dtype(dtype) and got.shape == (ROWS, DIM)
        assert np.array_equal(got.view(f"u{got.itemsize}"),
                              _pyarrow(path, name).view(f"u{got.itemsize}"))


@pytest.mark.parametrize("case", ["dictionary", "byte_stream_split", "null_row", "null_value",
                                  "variable_list"])
def test_direct_reader_declines_other_layouts(tmp_path: Path, case: str) -> None:
    x = _matrix("float16")
    path = tmp_path / "t.parquet"
    values = _vector_array(x)
    options: dict = {"use_dictionary": False, "compression": "zstd"}
    if case == "dictionary":
        options["use_dictionary"] = True
    elif case == "byte_stream_split":
        options["use_byte_stream_split"] = True
    elif case == "null_row":
        mask = np.zeros(ROWS, bool)
        mask[5] = True
        values = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), DIM,
                                                   mask=pa.array(mask))
    elif case == "null_value":
        flat = pa.array(x.reshape(-1), mask=np.arange(ROWS * DIM) == 17)
        values = pa.FixedSizeListArray.from_arrays(flat, DIM)
    else:
        values = pa.array([list(row) for row in x[:50]], pa.list_(pa.float16()))
    pq.write_table(pa.table({"v": values}), path, **options)
    parquet = pq.ParquetFile(path)
    columns = vector_columns(parquet.metadata, parquet.schema_arrow, ["v"])
    if case == "variable_list":
        assert columns == {}  # not a fixed-size list: never attempted
        return
    with pa.OSFile(str(path)) as source:
        assert read_vector_column(source, parquet.metadata, 0, columns["v"]) is None


def test_direct_reader_declines_a_corrupt_page(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"v": _vector_array(_matrix("float16"))}), path,
                   use_dictionary=False, compression="zstd")
    parquet = pq.ParquetFile(path)
    chunk = parquet.metadata.row_group(0).column(0)
    data = bytearray(path.read_bytes())
    start = chunk.data_page_offset
    data[start + 40:start + 400] = bytes(360)  # zero the start of the first page's body
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(bytes(data))
    column = vector_columns(parquet.metadata, parquet.schema_arrow, ["v"])["v"]
    with pa.OSFile(str(broken)) as source:
        assert read_vector_column(source, parquet.metadata, 0, column) is None


def test_torch_and_numpy_mix_are_bitwise_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    layers = [rng.standard_normal((500, 64)).astype(np.float16) for _ in range(3)]
    for mix in (Mix("top", (0.0, 0.0, 1.0)), Mix("average", (1.0, 1.0, 1.0)),
                Mix("custom", (0.2, 0.3, 0.5), gamma=0.7),
                Mix("tn", (0.5, 0.0, 0.5), gamma=1.3, token_norm=True)):
        monkeypatch.setattr(mixes, "_TORCH_MIN_VALUES", 1 << 60)
        by_numpy = mix_arrays(layers, mix)
        monkeypatch.setattr(mixes, "_TORCH_MIN_VALUES", 1)
        by_torch = mix_arrays(layers, mix)
        assert by_numpy.dtype == by_torch.dtype == np.float32
        assert np.array_equal(by_numpy.view(np.uint32), by_torch.view(np.uint32)), mix.name


def _all_mixed(ds_path: Path, mix: str | Mix, **kwargs) -> tuple[pa.Table, np.ndarray]:
    ds = open_dataset(str(ds_path))
    metas, vectors = [], []
    for meta, v in iter_mixed(ds, ds.mix(mix), **kwargs):
        assert meta.num_rows == len(v) > 0
        metas.append(meta)
        vectors.append(v)
    return pa.Table.from_batches(metas), np.concatenate(vectors)


def _embed_test_corpus(model_dir: Path, root: Path, **options: object) -> Path:
    from helpers import config, write_corpus

    from pipeline.write.embed import embed_corpus

    corpus = write_corpus(root / "corpus")
    out = root / "ds"
    embed_corpus(config(model_dir, [str(corpus / "*")], str(out), min_items=3, **options))
    return out


@pytest.fixture(scope="module")
def pipeline_dataset(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # float16: the layout the direct page reader exists for.
    return _embed_test_corpus(tiny_model_dir, tmp_path_factory.mktemp("direct"),
                              dtype="float16")


def test_pipeline_files_take_the_direct_path(pipeline_dataset: Path) -> None:
    """What the pipeline writes is what the direct reader reads (no silent fallback)."""
    files = sorted(pipeline_dataset.glob("tokens/*/*.parquet"))
    assert files
    for path in files:
        parquet = pq.ParquetFile(path)
        codecs = {parquet.metadata.schema.column(i).path.split(".")[0]:
                  parquet.metadata.row_group(0).column(i).compression
                  for i in range(parquet.metadata.num_columns)}
        assert codecs["token"] == "ZSTD" and "layer_0" not in codecs  # in types/ (v3)
        assert codecs["layer_1"] == codecs["layer_2"] == "SNAPPY"
        types = pq.ParquetFile(str(path).replace("/tokens/", "/types/"))
        assert types.metadata.row_group(0).column(1).compression == "ZSTD"
        names = ["layer_1", "layer_2"]
        columns = vector_columns(parquet.metadata, parquet.schema_arrow, names)
        assert sorted(columns) == names
        for name in names:
            got = np.concatenate(_direct(path, name))  # type: ignore[arg-type]
            assert np.array_equal(got.view(np.uint16), _pyarrow(path, name).view(np.uint16))


def test_iter_mixed_is_the_same_for_any_workers_and_batch_size(pipeline_dataset: Path) -> None:
    meta_1, vec_1 = _all_mixed(pipeline_dataset, "average", workers=1)
    meta_3, vec_3 = _all_mixed(pipeline_dataset, "average", workers=3, batch_rows=7)
    assert meta_1.equals(meta_3)
    assert np.array_equal(vec_1, vec_3)
    # The same rows as pyarrow reads, in file order, and the mix of what it reads.
    ds = open_dataset(str(pipeline_dataset))
    table = pa.concat_tables([pq.read_table(f) for f in ds.paths("tokens")])
    assert meta_1.column("doc_id").to_pylist() == table.column("doc_id").to_pylist()
    layers = _pyarrow_layers(ds, table)
    assert np.array_equal(vec_1, mix_arrays(layers, ds.mix("average")))


REFERENCE_MIXES = [Mix("top", (0.0, 0.0, 1.0)), Mix("average", (1.0, 1.0, 1.0)),
                   Mix("custom", (0.2, 0.3, 0.5), gamma=0.7),
                   Mix("two", (0.6, 0.0, 0.4), gamma=1.9)]


@pytest.mark.parametrize("mix", REFERENCE_MIXES, ids=lambda m: m.name)
def test_every_fast_mix_path_equals_the_reference_equation(
        pipeline_dataset: Path, monkeypatch: pytest.MonkeyPatch, mix: Mix) -> None:
    """The page-fused reader, and the numpy and torch accumulate, against the paper's
    equation as ``elmo_model.layer_mix`` computes it from pyarrow's decoding."""
    ds = open_dataset(str(pipeline_dataset))
    table = pa.concat_tables([pq.read_table(f) for f in ds.paths("tokens")])
    layers = _pyarrow_layers(ds, table)
    want = layer_mix(layers, mix.scalars, gamma=mix.gamma)
    _, fused = _all_mixed(pipeline_dataset, mix, workers=2)
    monkeypatch.setattr(mixes, "_TORCH_MIN_VALUES", 1 << 60)
    by_numpy = mix_arrays(layers, mix)
    monkeypatch.setattr(mixes, "_TORCH_MIN_VALUES", 1)
    by_torch = mix_arrays(layers, mix)
    for got in (fused, by_numpy, by_torch):
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _pyarrow_layers(ds: Any, table: pa.Table) -> list[np.ndarray]:
    """The three layers as pyarrow decodes them; layer 0 from the types files (v3)."""
    layer_0 = np.concatenate([
        read_types(ds.arrow_filesystem(), f).for_tokens(pq.read_table(f, columns=["token"])
                                                        .column("token"))
        for f in ds.paths("tokens")])
    return [layer_0] + [_pyarrow_column(table, f"layer_{k}") for k in (1, 2)]


def _pyarrow_column(table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name).combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), -1)


def test_iter_mixed_falls_back_to_pyarrow_for_other_layouts(pipeline_dataset: Path,
                                                            tmp_path: Path) -> None:
    """Files rewritten by another tool (dictionary pages, BYTE_STREAM_SPLIT) mix the same."""
    copy = tmp_path / "ds"
    shutil.copytree(pipeline_dataset, copy)
    for i, path in enumerate(sorted(copy.glob("tokens/*/*.parquet"))):
        table = pq.read_table(path)
        layers = [c for c in table.column_names if c.startswith("layer_")]
        options = {"use_dictionary": True} if i % 2 else {"use_byte_stream_split": layers,
                                                          "use_dictionary": False}
        pq.write_table(table, path, compression="zstd", **options)
    want_meta, want = _all_mixed(pipeline_dataset, "top", columns=("token",))
    got_meta, got = _all_mixed(copy, "top", columns=("token",))
    assert got_meta.equals(want_meta)
    assert np.array_equal(got, want)
    _, no_columns = _all_mixed(copy, "layer:0", columns=())
    assert len(no_columns) == len(want)


def test_float32_storage_mixes_the_same_way(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``--dtype float32`` datasets go through the direct reader too (physical FLOAT)."""
    ds_path = _embed_test_corpus(tiny_model_dir, tmp_path, dtype="float32")
    for path in sorted(ds_path.glob("tokens/*/*.parquet")):
        got = _direct(path, "layer_2")
        assert all(part is not None and part.dtype == np.float32 for part in got)
    meta, vectors = _all_mixed(ds_path, "average", workers=2, batch_rows=5)
    ds = open_dataset(str(ds_path))
    table = pa.concat_tables([pq.read_table(f) for f in ds.paths("tokens")])
    layers = _pyarrow_layers(ds, table)
    assert layers[0].dtype == np.float32
    assert np.array_equal(vectors, mix_arrays(layers, ds.mix("average")))
    assert meta.num_rows == table.num_rows


def test_a_page_header_cut_short_or_of_other_types_is_an_unsupported_layout() -> None:
    """The page walk decodes headers with the project's one Thrift codec; a header that
    ends early, or names a read field with a type we do not read, is a layout to leave
    to pyarrow (UnsupportedLayoutError), never an IndexError or a wrong number."""
    from pipeline.lookup.layers.parquet import UnsupportedLayoutError, page_header
    from schemas.thrift_compact import binary, encode_struct, i32, struct

    header = encode_struct({1: i32(0), 2: i32(40), 3: i32(30),
                            5: struct({1: i32(10), 2: i32(0), 3: i32(3), 4: i32(3)})})
    fields, end = page_header(header, 0, {1: True, 2: True, 3: True, 5: {1: True, 2: True}})
    assert fields == {1: 0, 2: 40, 3: 30, 5: {1: 10, 2: 0}} and end == len(header)
    for cut in range(len(header)):
        with pytest.raises(UnsupportedLayoutError):
            page_header(header[:cut], 0, {1: True})
    with pytest.raises(UnsupportedLayoutError, match="field 2 has Thrift type 8"):
        page_header(encode_struct({1: i32(0), 2: binary(b"x")}), 0, {2: True})
