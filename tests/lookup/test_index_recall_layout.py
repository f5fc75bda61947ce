"""A compact index's recall against exact search, its shards' int8 vectors, its documents'
fields kept once and joined by doc_id (filters and hits), and an index of an older storage
generation refused in one line that names the build making it again.

The synthetic dataset is int8 (as ``elmo embed`` writes by default) with the ``top`` mix:
the shards' int8 vectors are then the dataset's own values, so "exact" here is an exact
scan of the dataset's vectors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers import REPO
from synthetic_dataset import write_synthetic

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.ivf_build import PQ_MIN_ROWS
from pipeline.lookup.index.ivf_search import IVF_DIR
from pipeline.lookup.index.ivf_shards import (
    CANDIDATE_STEPS,
    SHARDS_FORMAT,
    VECTORS_FILE,
    ShardedIvf,
)
from pipeline.lookup.index.meta import INDEX_META
from pipeline.lookup.index.row_vectors import VECTOR_ROWS_FILE
from pipeline.lookup.index.sense_index import SenseIndex, read_meta
from pipeline.lookup.layers.mixes import iter_mixed
from schemas.dataset import open_dataset

DIM = 64
ROWS = 12_000  # over PQ_MIN_ROWS: product codes, whose candidates the re-rank sorts out
KEYS = ("doc_id", "sent_idx", "tok_idx")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recall")
    write_synthetic(root / "ds", ROWS, DIM, n_shards=2, vocab=300, dtype="int8")
    build_index(str(root / "ds"), "top", str(root / "ix"))
    return root


@pytest.fixture(scope="module")
def truth(built: Path) -> tuple[list[tuple], np.ndarray]:
    """Every token's key and mixed vector as the dataset gives them."""
    ds = open_dataset(str(built / "ds"))
    keys, parts = [], []
    for batch, vec in iter_mixed(ds, ds.mix("top"), columns=KEYS):
        rows = pa.Table.from_batches([batch])
        keys += list(zip(*(rows[c].to_pylist() for c in KEYS), strict=True))
        parts.append(np.asarray(vec, np.float32))
    return keys, np.concatenate(parts)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_shards_hold_the_datasets_int8_vectors(built: Path, truth: tuple) -> None:
    """Each shard's vectors are int8, one byte a value, and point where the dataset's do
    (for an int8 dataset and one layer: the dataset's own values, read in place: the
    shard holds a byte offset a row, not a copy)."""
    index = SenseIndex(str(built / "ix"))
    record = index.meta.ivf
    assert record is not None and record["format"] == SHARDS_FORMAT and record["rows"] == ROWS
    ivf = index.ivf()
    assert isinstance(ivf, ShardedIvf) and ivf.vectors.dtype == np.int8
    for shard in record["shards"].values():
        folder = built / "ix" / IVF_DIR / shard["folder"]
        assert not (folder / VECTORS_FILE).exists()
        offsets = np.load(folder / VECTOR_ROWS_FILE, mmap_mode="r")
        assert offsets.dtype == np.int64 and offsets.shape == (shard["rows"],)
    keys, vectors = truth
    rows = ivf.take_rows(list(KEYS), np.arange(ROWS))
    found = {key: i for i, key in enumerate(keys)}
    order = [found[key] for key in zip(*(rows[c].to_pylist() for c in KEYS), strict=True)]
    cosines = np.sum(_unit(ivf.vectors[np.arange(ROWS)].astype(np.float32))
                     * _unit(vectors[order]), axis=1)
    assert cosines.min() > 1 - 1e-6


def test_recall_against_exact_search_on_stored_and_new_queries(built: Path,
                                                               truth: tuple) -> None:
    """The build measured how many candidates its product codes need and recorded it;
    searches at the defaults find >= 0.95 of the exact 10 for stored rows and for new
    vectors (noisy copies: not in the index), and their distances are the exact ones."""
    keys, vectors = truth
    index = SenseIndex(str(built / "ix"))
    record = index.meta.ivf
    assert ROWS >= PQ_MIN_ROWS and record["codes"].startswith("PQ")
    assert record["candidates"] in CANDIDATE_STEPS and record["recall_at_10"] >= 0.95
    rng = np.random.default_rng(7)
    stored = vectors[rng.choice(ROWS, 30, replace=False)]
    new = vectors[rng.choice(ROWS, 30, replace=False)] \
        + 0.5 * rng.standard_normal((30, DIM)).astype(np.float32)
    unit = _unit(vectors)
    for queries in (stored, new):
        recall = []
        for query in queries:
            got = index.search(query, k=10, columns=list(KEYS))
            sims = unit @ _unit(query)
            want = {keys[i] for i in np.argsort(-sims, kind="stable")[:10]}
            got_keys = list(zip(*(got[c].to_pylist() for c in KEYS), strict=True))
            recall.append(len(set(got_keys) & want) / 10)
            at = {key: i for i, key in enumerate(keys)}
            np.testing.assert_allclose(1 - got["_distance"].to_numpy(),
                                       [sims[at[k]] for k in got_keys], atol=1e-5)
        assert np.mean(recall) >= 0.95


def test_an_older_layout_is_one_line_naming_the_build_that_makes_it_again(
        built: Path, tmp_path: Path) -> None:
    """An index whose IVF is of an earlier generation (float16 vectors, format 2) is
    refused when opened, in one line with the command; that build (no --rebuild) makes it
    current, and `elmo index info` still describes it before."""
    import shutil

    out = tmp_path / "ix"
    shutil.copytree(built / "ix", out)
    meta_path = out / INDEX_META
    meta = json.loads(meta_path.read_text())
    meta["ivf"]["format"] = 2
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ElmoUserError) as raised:
        SenseIndex(str(out))
    message = str(raised.value)
    assert "\n" not in message and "older layout" in message
    assert f"elmo index build {meta['dataset']} --mix top --out {out}" in message
    elmo = [str(Path(sys.executable).with_name("elmo"))]
    cli = subprocess.run([*elmo, "senses", "search", "the bank", "--word", "bank",
                          "--index", str(out)], capture_output=True, text=True, cwd=REPO)
    assert cli.returncode != 0 and "Traceback" not in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1 and "older layout" in cli.stderr
    info = subprocess.run([*elmo, "index", "info", str(out)], capture_output=True,
                          text=True, cwd=REPO)
    assert info.returncode == 0, info.stderr
    build_index(meta["dataset"], "top", str(out))
    assert read_meta(str(out)).ivf["format"] == SHARDS_FORMAT
    assert SenseIndex(str(out)).search(np.ones(DIM, np.float32), k=3).num_rows == 3


@pytest.mark.slow
def test_fields_live_once_and_are_joined_by_doc_id_in_filters_and_hits(
        tmp_path: Path) -> None:
    """A compact index's token rows hold no document fields (not even ``source``): a
    filter on a field keeps the rows of the documents that pass, joined by doc_id, and
    every hit carries its document's fields."""
    from pipeline.lookup.senses.search import search_senses
    from pipeline.write.embed import EmbedConfig, ModelSpec, embed_corpus

    lines = ["She paid her savings into the bank in {}.",
             "They sat on the grassy bank of the river in {}.",
             "He borrowed money from the bank to buy a house in {}.",
             "Reeds covered the bank where the river bends in {}."]
    records = [{"id": f"d{i}-{year}", "text": line.format(year), "year": year,
                "president": "Barack Obama" if year > 2000 else "Woodrow Wilson"}
               for i, line in enumerate(lines) for year in (1913, 2009)]
    corpus = tmp_path / "speeches.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    embed_corpus(EmbedConfig(sources=[str(corpus)], out=str(tmp_path / "ds"),
                             model=ModelSpec.resolve(str(REPO / "models" / "default")),
                             min_items=2, progress=False, executor="local"))
    build_index(str(tmp_path / "ds"), "top", str(tmp_path / "ix"))
    index = SenseIndex(str(tmp_path / "ix"))
    assert index.meta.compact
    columns = set(index.table.schema.names)
    assert "source" not in columns and not any(c.startswith("meta_") for c in columns)
    for shard in index.meta.ivf["shards"].values():
        rows = pa.ipc.open_file(str(tmp_path / "ix" / IVF_DIR / shard["folder"]
                                    / "rows.arrow")).schema.names
        assert "source" not in rows and not any(c.startswith("meta_") for c in rows)
    hits = search_senses(index, "She paid her savings into the bank.", "bank", k=8,
                         filters={"president": "Barack Obama"})
    assert hits and all(h.fields["president"] == "Barack Obama" and h.fields["year"] == 2009
                        for h in hits)
    assert {h.doc_id for h in hits} <= {r["id"] for r in records if r["year"] == 2009}
    every = search_senses(index, "She paid her savings into the bank.", "bank", k=8)
    assert {h.fields["year"] for h in every} == {1913, 2009}


def test_one_ranking_of_hits_each_context_once_nearest_first() -> None:
    """``ranked_distinct`` is the ranking the CLI, the server's batches and its exact path
    share: nearest first, a context (sentence text and place) once, ranks 1..k, and it
    reads a generator only as far as it needs."""
    from pipeline.lookup.senses.hits import Hit, ranked_distinct

    def hit(similarity: float, sentence: str, tok_idx: int) -> Hit:
        return Hit(rank=0, similarity=similarity, token="bank", doc_id="d", sent_idx=0,
                   tok_idx=tok_idx, sentence=sentence, start=0, end=4)

    hits = [hit(0.9, "the bank", 1), hit(0.8, "the  bank", 1), hit(0.7, "the bank", 2),
            hit(0.6, "a bank", 1), hit(0.5, "other", 0)]
    ranked = ranked_distinct(hits, 3)
    assert [(h.similarity, h.rank) for h in ranked] == [(0.9, 1), (0.7, 2), (0.6, 3)]
    read = []

    def lazily():
        for h in hits:
            read.append(h)
            yield h

    assert len(ranked_distinct(lazily(), 1)) == 1 and len(read) <= 2
