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


def test_sql_returns_arrow(dataset: str) -> None:
    ds = pipeline.open_dataset(dataset)
    n = ds.sql("SELECT count(*) AS n FROM tokens").column("n").to_pylist()
    assert n == [ds.to_table(["token"], mix="top").num_rows]
    the = ds.sql("SELECT count(*) AS n FROM tokens WHERE lower(token) = ?", ["the"])
    assert isinstance(the, pa.Table) and the.column("n")[0].as_py() > 10


def test_index_search_and_senses(dataset: str, tmp_path: Path) -> None:
    from pipeline.lookup.index.build import build_index

    out = str(tmp_path / "ix")
    build_index(dataset, "top", out, kind="flat", compact=False)
    ix = pipeline.open_index(out)
    hits = ix.search("Will you play upon this pipe ?", "play", k=3)
    assert 1 <= len(hits) <= 3
    assert all(hit.token.lower().startswith("play") for hit in hits)
    assert [hit.rank for hit in hits] == list(range(1, len(hits) + 1))
    senses = ix.senses("play", k=2)
    assert senses.k == 2 and sum(c.size for c in senses.clusters) == len(senses.occurrences)


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
