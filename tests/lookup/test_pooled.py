"""Pooled sentence and document vectors (``elmo pool``): the stored values against a numpy
reference from the stored layers, the derived table's files read by DuckDB, pyarrow,
polars and Spark without our code, ``elmo dataset verify`` on them, incremental pooling,
and the SQL views. Passage search is in ``test_passages.py``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import config, read_table, write_corpus

from elmo_model.errors import ElmoUserError
from pipeline.lookup.layers.mixes import mix_arrays
from pipeline.lookup.pooled.pooling import METHODS
from pipeline.lookup.pooled.store import pool_dataset, read_pooled_table
from pipeline.write.embed import embed_corpus
from schemas.dataset import open_dataset


@pytest.fixture(scope="module")
def dataset(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The helpers' corpus (text, JSON Lines, Parquet) in two shards, tiny model, int8."""
    root = tmp_path_factory.mktemp("pooled")
    out = root / "ds"
    embed_corpus(config(tiny_model_dir, [str(write_corpus(root / "corpus"))], out,
                        min_items=2))
    return out


def elmo(argv: list[str]) -> int:
    """The ``elmo`` command in this process, every verb registered."""
    from pipeline import cli

    return cli.main(argv)


def fresh(dataset: Path, tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    shutil.copytree(dataset, out)
    return out


def reference(out: Path, mix: str, by: str, method: str) -> dict[tuple, np.ndarray]:
    """Each group's pooled vector from the stored layers, by plain numpy."""
    tokens = read_table(out, "tokens")
    the_mix = open_dataset(str(out)).mix(mix)
    layers = [np.stack(tokens[f"layer_{k}"].to_numpy(zero_copy_only=False)
                       ).astype(np.float32) for k in range(the_mix.n_layers)]
    mixed = mix_arrays(layers, the_mix)
    docs = tokens["doc_id"].to_pylist()
    sents = tokens["sent_idx"].to_pylist()
    groups: dict[tuple, list[int]] = {}
    for i, (d, s) in enumerate(zip(docs, sents, strict=True)):
        groups.setdefault((d, s) if by == "sentence" else (d,), []).append(i)
    out_vectors = {}
    for key, rows in groups.items():
        x = mixed[rows].astype(np.float64)
        unit = x / np.linalg.norm(x, axis=1, keepdims=True)
        out_vectors[key] = {"mean": x.mean(0), "max": x.max(0), "unit_mean": unit.mean(0),
                            "mean_max": np.concatenate([x.mean(0), x.max(0)])}[method]
    return out_vectors


def stored_vectors(table: Any, by: str) -> dict[tuple, np.ndarray]:
    keys = zip(table["doc_id"].to_pylist(), table["sent_idx"].to_pylist(), strict=True) \
        if by == "sentence" else ((d,) for d in table["doc_id"].to_pylist())
    return {key: np.asarray(v, np.float32)
            for key, v in zip(keys, table["vector"].to_pylist(), strict=True)}


@pytest.mark.parametrize("by", ["sentence", "document"])
def test_pooled_values_equal_a_numpy_reference(dataset: Path, tmp_path: Path,
                                               by: str) -> None:
    out = fresh(dataset, tmp_path)
    shards = len(open_dataset(str(out)).shard_files("tokens"))
    for method in METHODS:
        for mix in ("average", "layer:0"):
            summary = pool_dataset(str(out), mix, by, method)
            assert (summary.pooled_shards, summary.kept_shards) == (shards, 0)
            got = stored_vectors(read_pooled_table(open_dataset(str(out)), by, mix, method),
                                 by)
            want = reference(out, mix, by, method)
            assert set(got) == set(want)
            for key, vector in want.items():
                np.testing.assert_allclose(got[key], vector, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{by} {method} {mix} {key}")


def test_groups_split_across_batches_pool_as_whole_groups(
        dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 3 rows cut most sentences and every document into pieces: their
    statistics are merged into one row per group."""
    from pipeline.lookup.pooled import store

    monkeypatch.setattr(store, "BATCH_ROWS", 3)
    out = fresh(dataset, tmp_path)
    for by in ("sentence", "document"):
        for method in METHODS:
            pool_dataset(str(out), "average", by, method)
            got = stored_vectors(read_pooled_table(open_dataset(str(out)), by, "average",
                                                   method), by)
            want = reference(out, "average", by, method)
            assert set(got) == set(want)
            for key, vector in want.items():
                np.testing.assert_allclose(got[key], vector, rtol=1e-5, atol=1e-6)


def registry_files(out: Path, table: str) -> list[Path]:
    """What a reader without our code reads: the files ``_derived.json`` lists."""
    registry = json.loads((out / "_derived.json").read_text())
    return [out / entry["path"] for entry in registry["tables"][table].values()]


def test_engines_read_the_pooled_files_without_elmo(dataset: Path, tmp_path: Path) -> None:
    import duckdb
    import polars as pl

    out = fresh(dataset, tmp_path)
    pool_dataset(str(out), "average", "sentence", "mean")
    want = stored_vectors(read_pooled_table(open_dataset(str(out)), "sentence", "average",
                                            "mean"), "sentence")
    files = registry_files(out, "sentence_vectors")
    arrow = pq.read_table(files)
    by_duckdb = duckdb.sql(
        "SELECT v.doc_id, v.sent_idx, v.vector, s.text FROM read_parquet($files) v "
        f"JOIN read_parquet('{out}/sentences/*/*.parquet') s USING (doc_id, sent_idx)",
        params={"files": [str(f) for f in files]}).fetchall()
    by_polars = pl.read_parquet(files)
    assert len(by_duckdb) == arrow.num_rows == by_polars.height == len(want)
    for d, s, vector, _ in by_duckdb:
        np.testing.assert_allclose(np.asarray(vector, np.float32), want[(d, s)], rtol=1e-6)
    assert stored_vectors(arrow, "sentence").keys() == want.keys()


@pytest.mark.slow  # a JVM
def test_spark_reads_the_pooled_files(dataset: Path, tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    out = fresh(dataset, tmp_path)
    pool_dataset(str(out), "average", "document", "mean")
    session = (SparkSession.builder.master("local[1]").appName("elmo-store-pooled")
               .config("spark.ui.enabled", "false").getOrCreate())
    try:
        rows = session.read.parquet(*map(str, registry_files(out, "document_vectors"))
                                    ).select("doc_id", "vector").collect()
    finally:
        session.stop()
    want = stored_vectors(read_pooled_table(open_dataset(str(out)), "document", "average",
                                            "mean"), "document")
    assert {(r[0],) for r in rows} == set(want)
    for r in rows:
        np.testing.assert_allclose(np.asarray(r[1], np.float32), want[(r[0],)], rtol=1e-6)


def test_sql_views_join_sentences_and_documents(dataset: Path, tmp_path: Path) -> None:
    from pipeline.lookup.sql import run_query

    out = fresh(dataset, tmp_path)
    empty = run_query(str(out), "SELECT count(*) n FROM sentence_vectors").to_pylist()
    assert empty == [{"n": 0}]
    pool_dataset(str(out), "average", "sentence", "mean")
    pool_dataset(str(out), "top", "document", "max")
    joined = run_query(str(out), "SELECT count(*) n, count(s.text) texts FROM "
                       "sentence_vectors v JOIN sentences s USING (doc_id, sent_idx)"
                       ).to_pylist()[0]
    total = run_query(str(out), "SELECT count(*) n FROM sentences").to_pylist()[0]["n"]
    assert joined == {"n": total, "texts": total}
    docs = run_query(str(out), "SELECT d.source, len(v.vector) width, v.mix, v.method "
                     "FROM document_vectors v JOIN documents d USING (doc_id)").to_pylist()
    assert len(docs) == len(read_table(out, "documents"))
    assert {(r["mix"], r["method"], r["width"]) for r in docs} == {
        ("top", "max", open_dataset(str(out)).descriptor.dim)}


def test_verify_finds_a_damaged_pooled_file(dataset: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = fresh(dataset, tmp_path)
    pool_dataset(str(out), "average", "sentence", "mean")
    assert elmo(["dataset", "verify", str(out)]) == 0
    damaged = registry_files(out, "sentence_vectors")[0]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    capsys.readouterr()
    assert elmo(["dataset", "verify", str(out)]) != 0
    said = capsys.readouterr().out
    assert damaged.name in said and "elmo pool" in said
    with pytest.raises(ElmoUserError, match=r"damaged.*--rebuild"):
        read_pooled_table(open_dataset(str(out)), "sentence", "average", "mean")


def test_pooling_again_pools_only_new_documents(dataset: Path, tmp_path: Path,
                                                tiny_model_dir: Path) -> None:
    out = fresh(dataset, tmp_path)
    first = pool_dataset(str(out), "average", "sentence", "mean")
    before = json.loads((out / "_derived.json").read_text())["tables"]["sentence_vectors"]
    assert pool_dataset(str(out), "average", "sentence", "mean").pooled_shards == 0

    more = tmp_path / "more"
    more.mkdir()
    (more / "new.txt").write_text("A brand new document arrives. It has two sentences.\n")
    embed_corpus(config(tiny_model_dir, [str(more / "new.txt")], out, part="more"))
    second = pool_dataset(str(out), "average", "sentence", "mean")
    assert (second.pooled_shards, second.kept_shards) == (1, first.pooled_shards)
    assert second.rows == 2
    after = json.loads((out / "_derived.json").read_text())["tables"]["sentence_vectors"]
    assert {k: after[k] for k in before} == before  # the old files were not rewritten
    table = read_pooled_table(open_dataset(str(out)), "sentence", "average", "mean")
    assert table.num_rows == first.rows + 2
    want = reference(out, "average", "sentence", "mean")
    for key, vector in stored_vectors(table, "sentence").items():
        np.testing.assert_allclose(vector, want[key], rtol=1e-5, atol=1e-6)


def test_user_mistakes_are_one_line_errors(dataset: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = fresh(dataset, tmp_path)
    assert elmo(["pool", str(out), "--mix", "nope"]) == 2
    assert elmo(["pool", str(out), "--mix", '{"weights": [1, 1, 1]}']) == 2
    assert elmo(["search", "passages", "some text", "--dataset",
                                 str(out)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line]
    assert len(lines) == 3 and all(line.startswith("elmo: error: ") for line in lines)
    assert "elmo pool" in lines[2]  # the fix: pool first


def test_a_shard_that_leaves_the_live_view_loses_its_rows(dataset: Path, tmp_path: Path,
                                                         tiny_model_dir: Path) -> None:
    from pipeline.lookup.sql import run_query
    from schemas.manifest import publish_live

    out = fresh(dataset, tmp_path)
    (tmp_path / "new.txt").write_text("Soon to be dropped. Two sentences.\n")
    embed_corpus(config(tiny_model_dir, [str(tmp_path / "new.txt")], out, part="more"))
    pool_dataset(str(out), "average", "sentence", "mean")
    ds = open_dataset(str(out))
    publish_live(ds.fs, ds.root, ["main"])  # as a job does when it drops a part
    live = run_query(str(out), "SELECT count(*) n FROM sentences").to_pylist()[0]["n"]
    assert read_pooled_table(open_dataset(str(out)), "sentence", "average",
                             "mean").num_rows == live  # our readers skip it at once
    summary = pool_dataset(str(out), "average", "sentence", "mean")
    assert (summary.pooled_shards, summary.emptied_shards) == (0, 1)
    rows = pq.read_table(registry_files(out, "sentence_vectors")).num_rows
    assert rows == live  # and readers without our code after the next pool
