"""Each stored layout read by DuckDB, pyarrow, polars and Spark with no elmo code: the
plain join of ``tokens`` and ``types`` that docs/dataset_format.md shows, checked against
elmo's own reader (``read_table``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers import config, write_corpus

from pipeline.lookup.layers.tokens import read_table
from pipeline.write.embed import embed_corpus

DTYPES = ("float16", "float32", "int8")
KEYS = ["doc_id", "sent_idx", "tok_idx"]


@pytest.fixture(scope="module")
def stored(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engines")
    corpus = write_corpus(root / "corpus")
    out = {}
    for dtype in DTYPES:
        out[dtype] = root / dtype
        embed_corpus(config(tiny_model_dir, [str(corpus)], out[dtype], dtype=dtype,
                            min_items=2))
    return out


def expected(out: Path) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """(layer_0, layer_1) of every token by its key, as elmo reads them."""
    table = read_table(str(out))
    l0 = np.stack(table["layer_0"].to_numpy(zero_copy_only=False)).astype(np.float32)
    l1 = np.stack(table["layer_1"].to_numpy(zero_copy_only=False)).astype(np.float32)
    keys = zip(*(table[k].to_pylist() for k in KEYS), strict=True)
    return {key: (l0[i], l1[i]) for i, key in enumerate(keys)}


def check(out: Path, rows: Iterator[tuple[tuple, Any, Any]]) -> None:
    """Every row an engine produced equals elmo's reading of it (all rows, once)."""
    want = expected(out)
    seen = set()
    for key, layer_0, layer_1 in rows:
        ref_0, ref_1 = want[key]
        np.testing.assert_allclose(np.asarray(layer_0, np.float32), ref_0, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(layer_1, np.float32), ref_1, rtol=1e-6, atol=1e-7)
        seen.add(key)
    assert seen == set(want)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_duckdb_reads_the_documented_join(stored: dict[str, Path], dtype: str) -> None:
    import duckdb

    out = stored[dtype]
    half = "y.layer_0_half"
    l1 = "t.layer_1"
    if dtype == "int8":
        half = "list_transform(y.layer_0_half, lambda v: v * y.layer_0_half_scale)"
        l1 = "list_transform(t.layer_1, lambda v: v * t.layer_1_scale)"
    rows = duckdb.sql(
        f"SELECT t.doc_id, t.sent_idx, t.tok_idx, list_concat({half}, {half}) AS layer_0, "
        f"{l1} AS layer_1 "
        f"FROM read_parquet('{out}/tokens/*/*.parquet', hive_partitioning=true, "
        "filename=true) t "
        f"JOIN read_parquet('{out}/types/*/*.parquet', filename=true) y "
        "ON y.token = t.token AND y.filename = replace(t.filename, '/tokens/', '/types/')"
    ).fetchall()
    check(out, (((d, s, i), a, b) for d, s, i, a, b in rows))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_pyarrow_reads_each_shard_with_its_types(stored: dict[str, Path], dtype: str) -> None:
    out = stored[dtype]

    def rows() -> Iterator[tuple[tuple, Any, Any]]:
        for path in sorted(out.glob("tokens/*/*.parquet")):
            tokens = pq.read_table(path)
            types = pq.read_table(str(path).replace("/tokens/", "/types/"))
            half = np.stack(types["layer_0_half"].to_numpy(zero_copy_only=False))
            l1 = np.stack(tokens["layer_1"].to_numpy(zero_copy_only=False))
            if dtype == "int8":
                half = half * types["layer_0_half_scale"].to_numpy()[:, None]
                l1 = l1 * tokens["layer_1_scale"].to_numpy()[:, None]
            row = pc.index_in(tokens["token"], value_set=types["token"]).to_numpy()
            layer_0 = np.concatenate([half, half], axis=1)[row]
            keys = zip(*(tokens[k].to_pylist() for k in KEYS), strict=True)
            yield from ((key, layer_0[i], l1[i]) for i, key in enumerate(keys))

    check(out, rows())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_polars_reads_the_join(stored: dict[str, Path], dtype: str) -> None:
    import polars as pl

    out = stored[dtype]

    def rows() -> Iterator[tuple[tuple, Any, Any]]:
        for path in sorted(out.glob("tokens/*/*.parquet")):
            tokens = pl.read_parquet(path)
            types = pl.read_parquet(str(path).replace("/tokens/", "/types/"))
            joined = tokens.join(types, on="token", how="left")
            half = joined["layer_0_half"].to_numpy().astype(np.float32)
            l1 = joined["layer_1"].to_numpy().astype(np.float32)
            if dtype == "int8":
                half = half * joined["layer_0_half_scale"].to_numpy()[:, None]
                l1 = l1 * joined["layer_1_scale"].to_numpy()[:, None]
            layer_0 = np.concatenate([half, half], axis=1)
            keys = joined.select(KEYS).rows()
            yield from ((key, layer_0[i], l1[i]) for i, key in enumerate(keys))

    check(out, rows())


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[1]").appName("elmo-store-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.mark.slow
def test_spark_reads_float32_and_int8_and_not_float16(stored: dict[str, Path],
                                                      spark: Any) -> None:
    for dtype in ("float32", "int8"):
        out = stored[dtype]
        spark.read.parquet(str(out / "tokens")).createOrReplaceTempView("t")
        spark.read.parquet(str(out / "types")).createOrReplaceTempView("y")
        # One part (main): the hive column shard pairs a tokens file with its types file.
        half, l1 = "y.layer_0_half", "t.layer_1"
        if dtype == "int8":
            half = "transform(y.layer_0_half, v -> v * y.layer_0_half_scale)"
            l1 = "transform(t.layer_1, v -> v * t.layer_1_scale)"
        rows = spark.sql(
            f"SELECT t.doc_id, t.sent_idx, t.tok_idx, concat({half}, {half}) AS layer_0, "
            f"{l1} AS layer_1 FROM t JOIN y ON y.token = t.token AND y.shard = t.shard"
        ).collect()
        check(out, (((r[0], r[1], r[2]), r[3], r[4]) for r in rows))
    with pytest.raises(Exception, match=r"FLOAT16|Illegal Parquet type"):
        spark.read.parquet(str(stored["float16"] / "tokens")).collect()
