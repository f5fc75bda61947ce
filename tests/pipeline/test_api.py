"""The Python entries (``pipeline.embed``, ``pipeline.open_dataset``, ``pipeline.open_index``)
on a real dataset: the repository's example corpus embedded with the bundled model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import pipeline
from elmo_model.errors import ElmoUserError, SettingError

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "examples" / "corpus"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("api") / "ds")
    summary = pipeline.embed(f"{CORPUS}/*.txt", out, min_items=2, executor="local",
                             progress=False)
    assert summary.totals["tokens"] > 1000
    return out


def test_import_is_light() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, pipeline; "
         "print(' '.join(m for m in ('torch', 'pyarrow', 'duckdb', 'lancedb', 'ray') "
         "if m in sys.modules))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []


@pytest.mark.slow
def test_to_table_with_and_without_a_mix(dataset: str) -> None:
    ds = pipeline.open_dataset(dataset)
    n_layers = ds.descriptor.n_output_layers
    every = ds.to_table()
    assert {f"layer_{k}" for k in range(n_layers)} | {"token", "shard"} <= set(
        every.column_names)
    mixed = ds.to_table(["doc_id", "token"], mix="top")
    assert mixed.column_names == ["doc_id", "token", "vector"]
    assert mixed.schema.field("vector").type == pa.list_(pa.float32(), ds.descriptor.dim)
    assert mixed["token"].to_pylist() == every["token"].to_pylist()  # the same row order
    top = np.stack(every[f"layer_{n_layers - 1}"].to_numpy(zero_copy_only=False))
    vectors = np.stack(mixed["vector"].to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(vectors, top.astype(np.float32), rtol=1e-6, atol=1e-6)
    documents = ds.to_table(["doc_id", "source"], table="documents")
    assert documents.num_rows == 124 and documents.column_names == ["doc_id", "source"]


@pytest.mark.slow
def test_schema_count_rows_and_filters(dataset: str) -> None:
    import pyarrow.compute as pc

    ds = pipeline.open_dataset(dataset)
    every = ds.to_table()
    assert ds.schema == every.schema and ds.count_rows() == every.num_rows
    plays = [t for t in every["token"].to_pylist() if t == "play"]
    # One filter language: the CLI's conditions, a mapping, or pyarrow's expressions.
    for written in ("token=play", ["token=play"], {"token": "play"}, pc.field("token") == "play"):
        assert ds.count_rows(written) == len(plays), written
    table = ds.to_table(["doc_id", "sent_idx"], filter="sent_idx=1..2")
    assert table.column_names == ["doc_id", "sent_idx"]
    assert set(table["sent_idx"].to_pylist()) == {1, 2}
    assert table.num_rows == sum(1 for i in every["sent_idx"].to_pylist() if i in (1, 2))
    # A list is "any of" whatever its length; a range is written as one.
    assert ds.count_rows({"sent_idx": [1, 2]}) == table.num_rows
    assert ds.count_rows({"sent_idx": {">=": 1, "<=": 2}}) == table.num_rows
    assert ds.count_rows({"sent_idx": [1, 2, 3]}) > table.num_rows
    # Mixed and filtered: the vectors of the rows kept, in order.
    mixed = ds.to_table(["token", "tok_idx"], mix="top", filter="token=play|Play")
    whole = ds.to_table(["token"], mix="top")
    keep = [i for i, t in enumerate(whole["token"].to_pylist()) if t in ("play", "Play")]
    assert mixed["token"].to_pylist() == [whole["token"][i].as_py() for i in keep]
    np.testing.assert_array_equal(np.stack(mixed["vector"].to_numpy(zero_copy_only=False)),
                                  np.stack(whole["vector"].to_numpy(zero_copy_only=False))[keep])
    batches = list(ds.to_batches(["doc_id"], mix="top"))
    assert len(batches) > 1 and sum(b.num_rows for b in batches) == whole.num_rows
    assert ds.count_rows("source~shakespeare", table="documents") >= 1
    with pytest.raises(SettingError, match=r"^filter 'nope=1': no column 'nope'"):
        ds.count_rows("nope=1")
    with pytest.raises(SettingError, match=r"^where 'token': write FIELD=VALUE"):
        ds.count_rows("token")


@pytest.mark.slow
def test_sql_is_a_relation_on_one_connection(dataset: str) -> None:
    import duckdb

    ds = pipeline.open_dataset(dataset)
    n = ds.sql("SELECT count(*) AS n FROM tokens").fetchall()
    assert n == [(ds.count_rows(),)]
    the = ds.sql("SELECT token FROM tokens WHERE lower(token) = ?", ["the"])
    assert isinstance(the, duckdb.DuckDBPyRelation)
    assert the.aggregate("count(*)").fetchall()[0][0] > 10  # chained, as DuckDB users do
    assert ds.sql("SELECT 1").arrow().read_all().num_rows == 1
    connection = ds.connection
    ds.sql("SELECT count(*) FROM documents").fetchall()
    assert ds.connection is connection  # views built once, not per query
    top = ds.sql("SELECT count(*) FROM mix_top", mixes=["top"]).fetchall()[0][0]
    assert top == ds.count_rows()
    with pytest.raises(ElmoUserError, match=r"^SQL: .*nope"):
        ds.sql("SELECT nope FROM tokens")
    ds.close()


@pytest.mark.slow
def test_an_s3_dataset_opened_with_explicit_options(dataset: str, s3_endpoint: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """No credentials or endpoint in the environment: only ``storage_options`` reach S3,
    for SQL as for tables."""
    import s3fs

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": s3_endpoint}}
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("api-bucket")
    fs.put(dataset, "api-bucket/ds", recursive=True)
    local = pipeline.open_dataset(dataset)
    remote = pipeline.open_dataset("s3://api-bucket/ds", storage_options=options)
    assert remote.count_rows() == local.count_rows()
    assert remote.sql("SELECT count(DISTINCT doc_id) FROM tokens").fetchall() == \
        local.sql("SELECT count(DISTINCT doc_id) FROM tokens").fetchall()
    assert remote.sql("SELECT count(*) FROM tokens WHERE token = $w",
                      {"w": "play"}).fetchall()[0][0] == local.count_rows("token=play")
    assert remote.to_table(["token"], mix="top").equals(local.to_table(["token"], mix="top"))


@pytest.mark.slow
def test_index_built_searched_clustered_and_changed(dataset: str, tmp_path: Path) -> None:
    out = str(tmp_path / "ix")
    # A full, flat index: the quickest to build here (the default, compact, trains an IVF).
    ix = pipeline.build_index(pipeline.open_dataset(dataset), out, mix="top", compact=False,
                              kind="flat")
    hits = ix.search("Will you play upon this pipe ?", "play", k=3)
    assert 1 <= len(hits) <= 3
    assert all(hit.token.lower().startswith("play") for hit in hits)
    assert [hit.rank for hit in hits] == list(range(1, len(hits) + 1))
    same = pipeline.open_index(out).search("Will you play upon this pipe ?", "play", k=3,
                                           exact=True)
    assert [h.token for h in same] == [h.token for h in hits]
    anything = ix.search("Will you play upon this pipe ?", "play", k=20, any_word=True)
    assert any(not h.token.lower().startswith("play") for h in anything)
    one = ix.search("play", k=3)  # the sentence is the word
    assert all(hit.token.lower().startswith("play") for hit in one)
    source = hits[0].fields["source"]
    kept = ix.search("Will you play upon this pipe ?", "play", k=3, where=f"source={source}")
    assert kept and all(h.fields["source"] == source for h in kept)
    senses = ix.senses("play", k=2)
    assert senses.k == 2 and sum(c.size for c in senses.clusters) == len(senses.occurrences)
    ranking = ix.change("source", words=["the"], min_uses=5)
    assert [row.word for row in ranking.rows] == ["the"]
    with pytest.raises(SettingError, match=r"^k must be at least 1"):
        ix.index.vector_query(np.zeros((1, ix.index.meta.dim), np.float32), 0)
    with pytest.raises(SettingError, match=r"^name the word of the sentence .*\(word=\.\.\.\)"):
        ix.search("two words")


def test_embed_settings_are_the_config_s_fields() -> None:
    """``pipeline.embed``'s typed settings are ``EmbedConfig``'s and ``ReadOptions``'
    fields, by name and type: the dataclasses stay the one definition."""
    import dataclasses

    from pipeline.write.config import EmbedConfig, EmbedSettings
    from pipeline.write.inputs import ReadOptions

    fields = {f.name: str(f.type) for c in (EmbedConfig, ReadOptions)
              for f in dataclasses.fields(c) if f.name not in ("sources", "out", "model", "read")}
    # Both modules postpone annotations: the types compare as written.
    typed = {name: getattr(kind, "__forward_arg__", kind)
             for name, kind in EmbedSettings.__annotations__.items()}
    assert typed == fields


@pytest.mark.slow
def test_errors_in_the_library_s_terms(dataset: str, tmp_path: Path) -> None:
    ds = pipeline.open_dataset(dataset)
    with pytest.raises(ElmoUserError, match="no column 'nope' in tokens"):
        ds.to_table(["nope"], mix="top")
    with pytest.raises(ElmoUserError, match="no table 'words'"):
        ds.to_table(table="words")
    with pytest.raises(SettingError, match=r"^bogus is not a setting of embed") as caught:
        pipeline.embed(f"{CORPUS}/*.txt", str(tmp_path / "x"), bogus=1)
    assert caught.value.setting == "bogus"
    with pytest.raises(SettingError, match=r"^device: ") as caught:
        pipeline.embed(f"{CORPUS}/*.txt", str(tmp_path / "x"), device="tpu")
    assert "--" not in str(caught.value)  # no CLI flag in a library error
    assert not (tmp_path / "x").exists()  # nothing written
