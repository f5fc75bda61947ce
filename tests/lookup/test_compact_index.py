"""Compact sense indexes (``elmo index build --compact``): no vectors in LanceDB, product-
quantized codes in the in-memory IVF, the exact re-rank with the shards' int8 vectors (of an
int8 dataset and one layer: the dataset's own values). Checked against exact cosine over
the dataset's mixed vectors, filtered and not; kept up to date as the dataset changes,
refused while stale; on S3 (moto); over HTTP from a real server.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers import moto_fs, uncommit_shard_1
from synthetic_dataset import write_synthetic

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.ivf_build import PQ_MIN_ROWS
from pipeline.lookup.index.ivf_search import IVF_DIR, IvfSearch
from pipeline.lookup.index.ivf_shards import (
    CODE_BYTES,
    SENTENCES_FILE,
    SHARD_FILES,
    SHARDS_FORMAT,
    VECTORS_FILE,
    ShardedIvf,
)
from pipeline.lookup.index.projection import VALUES_PER_CODE_BYTE
from pipeline.lookup.index.row_vectors import IN_PLACE_FILES, VECTOR_ROWS_FILE
from pipeline.lookup.index.sense_index import SenseIndex, read_meta
from pipeline.lookup.layers.mixes import iter_mixed
from schemas.dataset import open_dataset

KEYS = ("doc_id", "sent_idx", "tok_idx")
DIM = 32
ROWS = 12_000  # over PQ_MIN_ROWS: product-quantized codes


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("compact")
    write_synthetic(root / "ds", ROWS, DIM, n_shards=2, vocab=200, dtype="int8")
    build_index(str(root / "ds"), "top", str(root / "ix"), compact=True)
    return root


@pytest.fixture(scope="module")
def truth(built: Path) -> tuple[list[tuple], list[str], np.ndarray]:
    """Every token's key, word and mixed vector as the dataset gives them."""
    ds = open_dataset(str(built / "ds"))
    keys, words, parts = [], [], []
    for batch, vec in iter_mixed(ds, ds.mix("top"), columns=(*KEYS, "token")):
        rows = pa.Table.from_batches([batch])
        keys += list(zip(*(rows[c].to_pylist() for c in KEYS), strict=True))
        words += rows["token"].to_pylist()
        parts.append(np.asarray(vec, np.float32))
    return keys, words, np.concatenate(parts)


def _keys(table: pa.Table) -> list[tuple]:
    return list(zip(*(table[c].to_pylist() for c in KEYS), strict=True))


def _exact(vectors: np.ndarray, query: np.ndarray, k: int, among: np.ndarray | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    among = np.arange(len(vectors)) if among is None else among
    unit = vectors[among] / np.linalg.norm(vectors[among], axis=1, keepdims=True)
    sims = unit @ (query / np.linalg.norm(query))
    order = np.argsort(-sims, kind="stable")[:k]
    return among[order], sims[order]


def _queries(vectors: np.ndarray, n: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(vectors), n, replace=False)
    return vectors[picks] + 0.3 * rng.standard_normal((n, vectors.shape[1])).astype(np.float32)


@pytest.mark.slow
def test_holds_codes_and_keys_its_vectors_beside_it(built: Path) -> None:
    index = SenseIndex(str(built / "ix"))
    meta = index.meta
    assert meta.compact and meta.built == "ivf" and meta.rows == ROWS >= PQ_MIN_ROWS
    held = meta.ivf
    assert held is not None and held["format"] == SHARDS_FORMAT
    # Two projected values a code byte (a width under DIM_STEP keeps every direction).
    assert held["projected_dim"] == DIM
    assert held["codes"] == f"PQ{min(DIM // VALUES_PER_CODE_BYTE, CODE_BYTES)}"
    # Reached, or the point after which more probes gain nothing (CALIBRATION_PLATEAU).
    assert held["recall_at_10"] >= 0.95
    for shard in held["shards"].values():
        folder = built / "ix" / IVF_DIR / shard["folder"]
        assert sorted(p.name for p in folder.iterdir()) == sorted([*SHARD_FILES,
                                                                    *IN_PLACE_FILES,
                                                                    SENTENCES_FILE])
    columns = index.table.schema.names
    assert "vector" not in columns and "row" in columns
    # The table has no vector index of LanceDB's: the IVF beside it is the only one.
    assert not any(ix.columns == ["vector"] for ix in index.table.list_indices())
    # The vectors it re-ranks with are the dataset's own int8 pages, read in place: an
    # 8-byte offset a row, no copy (docs/index_sizing.md gives the bytes a row by part).
    offset_bytes = sum((built / "ix" / IVF_DIR / s["folder"] / VECTOR_ROWS_FILE).stat()
                       .st_size for s in held["shards"].values())
    assert ROWS * 8 <= offset_bytes < ROWS * 8 + 1024 * len(held["shards"])
    assert not any((built / "ix" / IVF_DIR / s["folder"] / VECTORS_FILE).exists()
                   for s in held["shards"].values())


@pytest.mark.slow
def test_searches_rank_with_the_datasets_vectors(built: Path, truth: tuple) -> None:
    keys, words, vectors = truth
    index = SenseIndex(str(built / "ix"))
    q = _queries(vectors, 40)
    assert isinstance(index.vector_query(q[:1], k=10, columns=KEYS), IvfSearch)
    recall = []
    for query in q:
        got = index.search(query, k=10, columns=KEYS)
        want, sims = _exact(vectors, query, 10)
        recall.append(len(set(_keys(got)) & {keys[i] for i in want}) / 10)
        # Distances are 1 - the exact cosine of the dataset's vectors, nearest first.
        found = {key: i for i, key in enumerate(keys)}
        for key, distance in zip(_keys(got), got["_distance"].to_numpy(), strict=True):
            row = vectors[found[key]]
            cosine = row @ query / np.linalg.norm(row) / np.linalg.norm(query)
            assert abs((1 - distance) - cosine) < 1e-5
        # Exact: every row ranked, the exact answer.
        exact = index.search(query, k=10, columns=KEYS, exact=True)
        assert _keys(exact) == [keys[i] for i in want]
        np.testing.assert_allclose(1 - exact["_distance"].to_numpy(), sims, atol=1e-5)
    assert np.mean(recall) >= 0.95
    # A word prefilter: LanceDB picks the rows, their vectors rank them exactly.
    query = q[0]
    same = np.array([i for i, w in enumerate(words) if w == "w1"])
    want, _ = _exact(vectors, query, 7, same)
    got = index.search(query, k=7, words=["W1"], columns=[*KEYS, "token"])
    assert _keys(got) == [keys[i] for i in want] and set(got["token"].to_pylist()) == {"w1"}
    # Several queries at once: each the same as alone.
    many = index.vector_query(q[:3], k=5, words=["w2"], columns=KEYS).to_arrow()
    for i in range(3):
        one = index.search(q[i], k=5, words=["w2"], columns=KEYS)
        part = many.filter(pa.compute.equal(many["query_index"], i)).drop_columns(
            ["query_index"])
        assert part.equals(one)


@pytest.mark.slow
def test_a_filter_leaving_many_rows_searches_the_lists(built: Path, truth: tuple,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Above EXACT_FILTER_ROWS the filtered rows are searched through the lists and the
    sketches, restricted to them: only those rows come back, nearly the exact ones."""
    from pipeline.lookup.index import ivf_search

    keys, words, vectors = truth
    index = SenseIndex(str(built / "ix"))
    common = max(set(words), key=words.count)
    same = np.array([i for i, w in enumerate(words) if w == common])
    monkeypatch.setattr(ivf_search, "EXACT_FILTER_ROWS", len(same) - 1)
    recall = []
    for query in _queries(vectors, 20, seed=5):
        got = index.search(query, k=10, words=[common], columns=[*KEYS, "token"])
        assert set(got["token"].to_pylist()) == {common} and got.num_rows == 10
        want, _ = _exact(vectors, query, 10, same)
        recall.append(len(set(_keys(got)) & {keys[i] for i in want}) / 10)
    assert np.mean(recall) >= 0.9
    monkeypatch.setattr(ivf_search, "EXACT_FILTER_ROWS", len(same))
    exact = index.search(query, k=10, words=[common], columns=KEYS)
    assert _keys(exact) == [keys[i] for i in want]


@pytest.mark.slow
def test_occurrences_carry_the_datasets_vectors(built: Path, truth: tuple) -> None:
    keys, words, vectors = truth
    index = SenseIndex(str(built / "ix"))
    rows = index.occurrences(["w3"], columns=[*KEYS, "token"])
    assert rows.num_rows == words.count("w3")
    found = {key: i for i, key in enumerate(keys)}
    # Their directions (unit vectors): the shards keep no scale.
    got = np.stack(rows["vector"].to_numpy(zero_copy_only=False)).astype(np.float32)
    want = vectors[[found[k] for k in _keys(rows)]]
    np.testing.assert_allclose(got, want / np.linalg.norm(want, axis=1, keepdims=True),
                               atol=1e-6)


@pytest.mark.slow
def test_a_changed_dataset_is_followed_by_the_next_build(built: Path, tmp_path: Path,
                                                        truth: tuple) -> None:
    keys, _, vectors = truth
    ds = Path(shutil.copytree(built / "ds", tmp_path / "ds"))
    ix = tmp_path / "ix"
    build_index(str(ds), "top", str(ix), compact=True)
    # Building again without --compact keeps what it is; asking for the other kind is refused.
    assert build_index(str(ds), "top", str(ix)).skipped_files == 2
    assert SenseIndex(str(ix)).meta.compact
    with pytest.raises(ElmoUserError, match=r"is a compact index.*add rebuild=True"):
        build_index(str(ds), "top", str(ix), compact=False)
    # One of the shards the index holds is committed no more: the index answers from its
    # own vectors as it was built, until a build drops that shard.
    manifest = next((ds / "_manifest").iterdir())
    (next(manifest.glob("shard=1*"))).unlink()
    assert _keys(SenseIndex(str(ix)).search(vectors[0], k=1, columns=KEYS)) == [keys[0]]
    summary = build_index(str(ds), "top", str(ix))
    assert summary.removed_files == 1
    index = SenseIndex(str(ix))
    assert index.meta.rows == index.table.count_rows() < ROWS
    got = index.search(vectors[0], k=1, columns=KEYS)
    assert _keys(got) == [keys[0]]


@pytest.mark.slow
def test_grown_past_scalar_codes_it_trains_product_codes(built: Path, tmp_path: Path) -> None:
    """A refresh keeps an IVF's training only for the same kind of codes: a compact index
    that grows past PQ_MIN_ROWS trains product codes."""
    ds = Path(shutil.copytree(built / "ds", tmp_path / "ds"))
    record, kept = uncommit_shard_1(ds)
    ix = tmp_path / "ix"
    build_index(str(ds), "top", str(ix), compact=True)
    first = SenseIndex(str(ix)).meta.ivf
    assert first["codes"] == "SQ8" and first["rows"] < PQ_MIN_ROWS
    record.write_bytes(kept)
    build_index(str(ds), "top", str(ix))
    again = SenseIndex(str(ix)).meta.ivf
    assert again["rows"] == ROWS
    assert again["codes"] == f"PQ{min(DIM // VALUES_PER_CODE_BYTE, CODE_BYTES)}"
    assert again["trained_rows"] == ROWS


@pytest.mark.slow
def test_cli_builds_and_describes_it(built: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline import cli

    out = tmp_path / "ix"
    # A new index is compact unless --full says otherwise; --index and the search options
    # tune only a full one.
    assert cli.main(["index", "build", str(built / "ds"), "--out", str(out), "--index", "hnsw",
                     "--no-progress"]) == 2
    assert "tune a full index (LanceDB's HNSW); add --full" in capsys.readouterr().err
    assert not out.exists()
    assert cli.main(["index", "build", str(built / "ds"), "--out", str(out), "--full",
                     "--index", "hnsw", "--no-progress"]) == 0
    # A full index larger than its dataset (float16 vectors, LanceDB's graph, the in-memory
    # IVF's vectors again) says what --compact would do.
    assert _dir_bytes(out) > _dir_bytes(built / "ds")
    hint = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the dataset's bytes; --compact --rebuild makes one" in hint
    assert cli.main(["index", "build", str(built / "ds"), "--out", str(out), "--compact",
                     "--no-progress"]) == 2
    assert "not a compact index" in capsys.readouterr().err
    assert cli.main(["index", "build", str(built / "ds"), "--out", str(out), "--compact",
                     "--rebuild", "--no-progress"]) == 0
    assert "--compact" not in capsys.readouterr().err.strip().splitlines()[-1]
    assert cli.main(["index", "build", str(built / "ds"), "--out", str(out), "--compact",
                     "--ef", "200"]) == 2
    assert "--ef and --refine-factor tune a full index" in capsys.readouterr().err
    assert cli.main(["index", "build", str(built / "ds"), "--out", str(out), "--nprobes",
                     "5"]) == 2
    assert "add --full --rebuild, or leave them out" in capsys.readouterr().err
    assert cli.main(["index", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "vector index ivf" in text
    assert "compact: codes in memory, int8 vectors in its shards" in text
    held = read_meta(str(out)).ivf
    assert f"{held['codes']} codes in {held['projected_dim']} of {DIM} directions" in text
    assert f"{'with' if held['sketches'] else 'without'} sketches" in text
    # --rebuild alone keeps the kind; --full with it makes the other.
    assert cli.main(["index", "build", str(built / "ds"), "--out", str(out), "--rebuild",
                     "--no-progress"]) == 0
    assert read_meta(str(out)).compact
    assert cli.main(["index", "build", str(built / "ds"), "--out", str(out), "--rebuild",
                     "--full", "--no-progress"]) == 0
    assert not read_meta(str(out)).compact
    with pytest.raises(SystemExit):
        cli.main(["index", "build", str(built / "ds"), "--out", str(out), "--full", "--compact"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.slow
def test_a_new_index_is_compact(built: Path, truth: tuple, tmp_path: Path) -> None:
    """Without --full or --compact a new index keeps no vectors, answers as a compact one,
    and its later builds (and a job's refresh without ``index_compact``) keep it so."""
    from jobs.index_refresh import refresh_index

    out = tmp_path / "ix"
    summary = build_index(str(built / "ds"), "top", str(out))
    assert summary.built == "ivf" and read_meta(str(out)).compact
    assert "vector" not in SenseIndex(str(out)).table.schema.names
    assert refresh_index(str(built / "ds"), mix="top", index_uri=str(out)).added_rows == 0
    assert read_meta(str(out)).compact
    _, _, vectors = truth
    hits = SenseIndex(str(out)).search(vectors[7], k=1).to_pylist()
    assert hits[0]["_distance"] < 1e-3


@pytest.mark.slow
def test_stored_on_s3(built: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch,
                      truth: tuple, tmp_path: Path) -> None:
    """On an object store the shards are written whole and, when opened, copied to a local
    folder once: the same answers as the local index. The build's local copy is removed,
    also when it is killed, and the search's with its IVF."""
    import gc
    import tempfile

    from pipeline.lookup.index import ivf_shards_build
    from pipeline.lookup.index.ivf_shards_build import build_shards

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))

    fs = moto_fs(s3_endpoint, monkeypatch)
    fs.mkdir("compact-bucket")
    index = SenseIndex(str(built / "ix"))
    ds = open_dataset(index.meta.dataset)
    meta = read_meta(str(built / "ix"))
    meta.ivf = None
    held = build_shards(index.table, fs, "compact-bucket/ix", meta, ds,
                        dict(ds.shard_files("tokens")), sentences=index.sentences)
    for shard in held["shards"].values():
        folder = f"compact-bucket/ix/_ivf/{shard['folder']}"
        assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(folder, detail=False)) \
            == sorted([*SHARD_FILES, *IN_PLACE_FILES, SENTENCES_FILE])
    # The build's local copy is gone; the search's lives as long as its IVF.
    assert list(temp.iterdir()) == []
    remote = ShardedIvf.load(fs, "compact-bucket/ix", held, "`elmo index build`")
    assert len(list(temp.iterdir())) == 1
    local = index.ivf()
    assert local is not None
    q = _queries(truth[2], 5)
    got, want = remote.nearest_rows(q, 10, KEYS), local.nearest_rows(q, 10, KEYS)
    assert got.select(list(KEYS)).equals(want.select(list(KEYS)))
    del remote
    gc.collect()
    assert list(temp.iterdir()) == []
    # A build killed half way on S3: its local copy gone, nothing written to the bucket.
    monkeypatch.setattr(ivf_shards_build, "calibrate", _killed)
    with pytest.raises(KeyboardInterrupt):
        build_shards(index.table, fs, "compact-bucket/killed", meta, ds,
                     dict(ds.shard_files("tokens")))
    assert list(temp.iterdir()) == [] and not fs.exists("compact-bucket/killed")


def _killed(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


@pytest.mark.slow
def test_served_compact_index(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """Over HTTP a compact index of the bundled model answers a word's senses as the flat
    (exact) index of the same dataset does, and searches without a word too."""
    import httpx
    from serve_helpers import Served, running_server, served_compact_index, served_data

    data = served_data(tmp_path_factory)
    compact = served_compact_index(tmp_path_factory)
    ask = {"sentence": "Will you play upon this pipe ?", "word": "play", "k": 5}
    answers = []
    for index in (data.index, compact):
        with running_server(Served(data.dataset, index), log=tmp_path / "serve.log") as url:
            found = httpx.post(f"{url}/senses/search", json=ask, timeout=60)
            assert found.status_code == 200, found.text
            answers.append([(h["doc_id"], h["sent_idx"], h["tok_idx"])
                            for h in found.json()["hits"]])
            anyword = httpx.post(f"{url}/senses/search", json={**ask, "any_word": True},
                                 timeout=60)
            assert anyword.status_code == 200 and len(anyword.json()["hits"]) == 5
    assert answers[0] == answers[1] and len(answers[0]) == 5


@pytest.mark.slow
def test_a_moved_dataset_is_one_error_naming_the_fix(built: Path, tmp_path: Path) -> None:
    """A compact index whose dataset moved says where it looked and how to fix it: for
    what embeds a query (the dataset's model), and for a search, whose re-rank reads the
    dataset's own int8 pages in place."""
    ds, out = tmp_path / "ds", tmp_path / "ix"
    shutil.copytree(built / "ds", ds)
    build_index(str(ds), "top", str(out))
    ds.rename(tmp_path / "moved")
    fix = r"put the dataset back there, or build the index again .*--rebuild"
    with pytest.raises(ElmoUserError, match=r"dataset file .*main.parquet is not readable "
                                            r"\(moved or removed\).*elmo index build"):
        SenseIndex(str(out)).search(np.ones(DIM, np.float32), k=1)
    with pytest.raises(ElmoUserError, match=rf"built from {ds}, which is not readable.*{fix}"):
        SenseIndex(str(out)).dataset_descriptor()


@pytest.mark.slow
def test_codes_made_before_their_projection_are_refused_and_trained_again(
        built: Path, tmp_path: Path) -> None:
    """An index whose codes predate the projection (no ``projected_dim``) opens with one
    line naming the build; that build trains the codes again and keeps the shards' rows."""
    import json

    ds, out = tmp_path / "ds", tmp_path / "ix"
    shutil.copytree(built / "ds", ds)
    build_index(str(ds), "top", str(out))
    meta_file = out / "_elmo_index.json"
    meta = json.loads(meta_file.read_text())
    del meta["ivf"]["projected_dim"]  # as a build before 2026-11-29 recorded it
    meta_file.write_text(json.dumps(meta))
    rows_before = {key: (out / IVF_DIR / s["folder"] / "rows.arrow").read_bytes()
                   for key, s in meta["ivf"]["shards"].items()}
    with pytest.raises(ElmoUserError, match=r"codes predate their projection.*"
                                            r"`elmo index build .* trains them again"):
        SenseIndex(str(out)).search(np.ones(DIM, np.float32), k=1)
    build_index(str(ds), "top", str(out))
    again = SenseIndex(str(out))
    held = again.meta.ivf
    assert held["projected_dim"] == DIM and held["train"] != meta["ivf"]["train"]
    assert {key: (out / IVF_DIR / s["folder"] / "rows.arrow").read_bytes()
            for key, s in held["shards"].items()} == rows_before
    assert again.search(np.ones(DIM, np.float32), k=1).num_rows == 1
