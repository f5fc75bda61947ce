"""Schema version 3: layer 0 once per token type, int8 layers, old datasets still read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import config, write_corpus

from elmo_model.errors import ElmoUserError
from pipeline.lookup.layers.mixes import iter_mixed, mix_arrays
from pipeline.lookup.layers.tokens import (
    has_own_layer_0,
    layer_vectors,
    read_types,
    stored_columns,
)
from pipeline.lookup.sql import connect
from pipeline.write.embed import embed_corpus
from schemas import HALF_LAYER_0, SCHEMA_VERSION
from schemas.dataset import open_dataset
from schemas.layers import cast_floats, dequantize_int8, quantize_int8


@pytest.fixture(scope="module")
def datasets(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Path]:
    """The same corpus stored as float32 (the reference), float16 and int8."""
    root = tmp_path_factory.mktemp("v3")
    corpus = write_corpus(root / "corpus")
    out = {}
    for dtype in ("float32", "float16", "int8"):
        out[dtype] = root / dtype
        embed_corpus(config(tiny_model_dir, [str(corpus)], out[dtype], dtype=dtype, min_items=2))
    return out


def all_layers(path: Path) -> list[np.ndarray]:
    """Every layer of every token, through the readers' one decoding path."""
    ds = open_dataset(str(path))
    names = [f"layer_{k}" for k in range(ds.descriptor.n_output_layers)]
    fs = ds.arrow_filesystem()
    parts: list[list[np.ndarray]] = [[] for _ in names]
    for file in ds.paths("tokens"):
        table = pq.read_table(file)
        types = None if has_own_layer_0(table.schema) else read_types(fs, file)
        table = table.select(stored_columns(table.schema, names))
        for k, name in enumerate(names):
            parts[k].append(np.asarray(layer_vectors(table, name, types), np.float32))
    return [np.concatenate(p) for p in parts]


def test_int8_rule_round_trips_within_half_a_step() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 64)).astype(np.float32)
    x[3] = 0
    q, scale = quantize_int8(x)
    assert q.dtype == np.int8 and np.abs(q).max() == 127 and scale[3] == 0
    back = dequantize_int8(q, scale)
    assert np.all(np.abs(back - x) <= scale[:, None] / 2 + 1e-7)


@pytest.mark.parametrize("rows", [3, 4096])  # numpy's cast below the torch threshold, then torch
def test_cast_floats_rounds_as_numpy(rows: int) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((rows, 64)) * rng.choice([1e-7, 1e-3, 1, 3e4], (rows, 1)))
    x = x.astype(np.float32)
    # Ties between two float16 values, overflow, subnormals and NaN.
    x[0, :6] = [1 + 2 ** -11, 1 + 3 * 2 ** -11, 70000.0, -1e-8, np.nan, 65520.0]
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
        got = cast_floats(x, "float16")
        into = np.empty((rows + 2, 64), np.float16)
        cast_floats(x, "float16", out=into[1:-1])
    assert got.dtype == np.float16 and np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(into[1:-1], want, equal_nan=True)
    assert np.array_equal(cast_floats(want, "float32"), want.astype(np.float32), equal_nan=True)


def test_v3_moves_layer_0_to_types_once_per_token(datasets: dict[str, Path]) -> None:
    out = datasets["float16"]
    assert json.loads((out / "_dataset.json").read_text())["schema_version"] == SCHEMA_VERSION
    for tokens_file in sorted(out.glob("tokens/shard=*/*.parquet")):
        tokens = pq.read_table(tokens_file)
        types = pq.read_table(str(tokens_file).replace("/tokens/", "/types/"))
        assert "layer_0" not in tokens.column_names
        # ELMo's layer 0 is [x; x]: only the first half is stored.
        assert types.column_names == ["token", HALF_LAYER_0]
        assert types["token"].to_pylist() == list(dict.fromkeys(tokens["token"].to_pylist()))
        assert types.schema.field(HALF_LAYER_0).type.list_size == 8


def test_readers_see_every_layer_as_before(datasets: dict[str, Path]) -> None:
    """float16 and int8 reconstruct within their rounding of the float32 dataset, and
    layer 0 of every occurrence of a word is that word's type vector."""
    reference = all_layers(datasets["float32"])
    assert len(reference) == 3 and reference[0].shape[1] == 16
    for dtype, tolerance in (("float16", 2e-3), ("int8", 1.5e-2)):
        layers = all_layers(datasets[dtype])
        for ref, got in zip(reference, layers, strict=True):
            scale = np.abs(ref).max(axis=1, keepdims=True) + 1e-12
            assert np.max(np.abs(ref - got) / scale) <= tolerance, dtype
            cos = (ref * got).sum(1) / (np.linalg.norm(ref, axis=1) *
                                        np.linalg.norm(got, axis=1) + 1e-12)
            assert cos.min() > 0.999, dtype


def test_mixes_and_sql_on_v3(datasets: dict[str, Path]) -> None:
    for dtype in ("float16", "int8"):
        ds = open_dataset(str(datasets[dtype]))
        mix = ds.mix("average")
        expected = mix_arrays(all_layers(datasets[dtype]), mix)
        got = np.concatenate([v for _, v in iter_mixed(ds, mix, workers=2)])
        np.testing.assert_array_equal(got, expected)  # page path and pyarrow path agree
        con = connect(ds)
        sql = con.sql("SELECT elmo_mix(layer_0, layer_1, layer_2, 'average') AS v, "
                      "layer_0 FROM tokens ORDER BY shard, doc_id, sent_idx, tok_idx"
                      ).to_arrow_table()
        keys = [(m["doc_id"], m["sent_idx"], m["tok_idx"])
                for batch, _ in iter_mixed(ds, mix) for m in batch.to_pylist()]
        order = sorted(range(len(keys)), key=lambda i: keys[i])
        # Same rows; DuckDB computes the dequantisation in SQL, so compare closely.
        np.testing.assert_allclose(np.stack(sql["v"].to_numpy(zero_copy_only=False)),
                                   expected[order], rtol=1e-5, atol=1e-6)


def test_appending_v3_to_a_version_2_dataset_is_refused(
        tiny_model_dir: Path, datasets: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "old"
    shutil.copytree(datasets["float16"], out)
    descriptor = json.loads((out / "_dataset.json").read_text())
    descriptor["schema_version"] = 2
    (out / "_dataset.json").write_text(json.dumps(descriptor))
    corpus = write_corpus(tmp_path / "more")
    with pytest.raises(ElmoUserError, match=r"schema version 2.*write to a new out"):
        embed_corpus(config(tiny_model_dir, [str(corpus)], out, dtype="float16",
                            part="more"))


def write_as_version_2(v3: Path, out: Path) -> None:
    """The same dataset in version 2's layout: ``layer_0`` inline, no types files."""
    import shutil

    import pyarrow as pa

    from pipeline.write.item_files import token_file_compression
    from schemas import token_schema

    shutil.copytree(v3, out)
    shutil.rmtree(out / "types")
    descriptor = json.loads((out / "_dataset.json").read_text())
    descriptor["schema_version"] = 2
    (out / "_dataset.json").write_text(json.dumps(descriptor))
    schema = token_schema(3, descriptor["dim"], descriptor["dtype"], version=2)
    for path in sorted(v3.glob("tokens/*/*.parquet")):
        table = pq.read_table(path)
        fs = open_dataset(str(v3)).arrow_filesystem()
        layer_0 = read_types(fs, str(path)).for_tokens(table["token"])
        full = table.append_column("layer_0", pa.FixedSizeListArray.from_arrays(
            pa.array(layer_0.reshape(-1)), layer_0.shape[1])).select(schema.names).cast(schema)
        pq.write_table(full, out / path.relative_to(v3),
                       compression=token_file_compression(schema), use_dictionary=False)
    for entry in out.glob("_manifest/*/shard=*.json"):
        data = json.loads(entry.read_text())
        data["files"].pop("types", None)
        entry.write_text(json.dumps(data))


def test_a_version_2_dataset_reads_the_same(datasets: dict[str, Path], tmp_path: Path) -> None:
    """mixes (page reader), SQL and read_table on version 2 files give the v3 values."""
    old = tmp_path / "v2"
    write_as_version_2(datasets["float16"], old)
    assert not list(old.glob("types/*"))
    for mix in ("average", "layer:0"):
        new_ds, old_ds = open_dataset(str(datasets["float16"])), open_dataset(str(old))
        want = np.concatenate([v for _, v in iter_mixed(new_ds, new_ds.mix(mix))])
        got = np.concatenate([v for _, v in iter_mixed(old_ds, old_ds.mix(mix))])
        np.testing.assert_array_equal(got, want)
    [(count,)] = connect(str(old)).sql(
        "SELECT count(elmo_mix(layer_0, layer_1, layer_2, 'top')) FROM tokens").fetchall()
    assert count == len(want)
    assert all_layers(old)[0].tolist() == all_layers(datasets["float16"])[0].tolist()
