"""The in-memory IVF beside a full sense index (``pipeline/lookup/index/ivf_search.py``,
``ivf_build.py``): built by ``build_index`` from the LanceDB table, calibrated on its own
rows, used for searches without a prefilter, checked against exact search, rebuilt when
the table changes, ignored when it is stale, and stored on S3 (moto) as on local disk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pytest
from helpers import moto_fs, uncommit_shard_1
from synthetic_dataset import write_synthetic

from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.ivf_build import (
    CALIBRATION_RECALL,
    EXACT_BLOCK_ROWS,
    RETRAIN_GROWTH,
    build_ivf,
    calibrate,
    drop_other_folders,
    exact_nearest,
    probe_steps,
    trained_index,
)
from pipeline.lookup.index.ivf_search import IVF_DIR, IvfSearch, MemoryIvf, Sketch
from pipeline.lookup.index.lance_search import VectorSearch
from pipeline.lookup.index.projection import inverted
from pipeline.lookup.index.sense_index import INDEX_META, SenseIndex
from pipeline.lookup.layers.vectors import unit_vectors

KEYS = ("doc_id", "sent_idx", "tok_idx")
DIM = 32


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("held_ivf")
    data = write_synthetic(root / "ds", 6000, DIM, n_shards=2, vocab=200)
    build_index(str(root / "ds"), "top", str(root / "ix"), kind="hnsw", compact=False)
    return root, data


def _exact(index: SenseIndex, queries: np.ndarray, k: int) -> list[set[tuple]]:
    rows = index.table.search().select([*KEYS, "vector"]).limit(100_000).to_arrow()
    matrix = np.stack(rows["vector"].to_numpy(zero_copy_only=False)).astype(np.float32)
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    keys = list(zip(*(rows[c].to_pylist() for c in KEYS), strict=True))
    out = []
    for q in queries:
        best = np.argsort(-(unit @ (q / np.linalg.norm(q))))[:k]
        out.append({keys[i] for i in best})
    return out


def _keys(table: pa.Table) -> list[tuple]:
    return list(zip(*(table[c].to_pylist() for c in KEYS), strict=True))


def _queries(data: dict, n: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    top = data["top"]
    picks = rng.choice(len(top), n, replace=False)
    return top[picks] + 0.3 * rng.standard_normal((n, top.shape[1])).astype(np.float32)


@pytest.mark.slow
def test_built_beside_the_table_and_used_without_a_prefilter(built: tuple[Path, dict]) -> None:
    root, data = built
    index = SenseIndex(str(root / "ix"))
    held = index.meta.ivf
    assert held is not None and held["table_version"] == index.table.version
    assert held["rows"] == 6000 and held["lists"] == 77
    assert held["recall_at_10"] >= CALIBRATION_RECALL
    assert [p.name for p in (root / "ix" / IVF_DIR).iterdir()] == [held["folder"]]
    q = _queries(data, 40)
    assert isinstance(index.vector_query(q[:1], k=10, columns=KEYS), IvfSearch)
    # A prefilter, or exact search, still goes to LanceDB.
    assert isinstance(index.vector_query(q[:1], k=10, words=["w1"], columns=KEYS),
                      VectorSearch)
    assert isinstance(index.vector_query(q[:1], k=10, exact=True, columns=KEYS),
                      VectorSearch)
    # Recall@10 against exact cosine over every row, and distances 1 - cosine.
    truth = _exact(index, q, 10)
    recall = []
    for query, want in zip(q, truth, strict=True):
        got = index.search(query, k=10, columns=KEYS)
        assert got.column_names == [*KEYS, "_distance"] and got.num_rows == 10
        distances = got["_distance"].to_numpy()
        assert np.all(np.diff(distances) >= 0)
        exact = index.search(query, k=10, columns=KEYS, exact=True)
        # Distances are LanceDB's own for the same rows (the same stored vectors; LanceDB
        # sums in lower precision).
        lance = dict(zip(_keys(exact), exact["_distance"].to_pylist(), strict=True))
        for key, distance in zip(_keys(got), distances, strict=True):
            if key in lance:
                assert abs(distance - lance[key]) < 1e-4
        recall.append(len(set(_keys(got)) & want) / 10)
    assert np.mean(recall) >= 0.95


@pytest.mark.slow
def test_several_queries_and_full_result_columns(built: tuple[Path, dict]) -> None:
    root, data = built
    index = SenseIndex(str(root / "ix"))
    q = _queries(data, 4, seed=9)
    many = index.vector_query(q, k=5).to_arrow()
    assert many["query_index"].to_pylist() == [i for i in range(4) for _ in range(5)]
    for i in range(4):
        one = index.search(q[i], k=5)
        part = many.filter(pa.compute.equal(many["query_index"], i)).drop_columns(
            ["query_index"])
        assert part.select(one.column_names).equals(one)
    # Every result column is what LanceDB's path gives for the same row.
    index.use_ivf = False
    lance = index.search(q[0], k=5, exact=True)
    index.use_ivf = True
    by_key = dict(zip(_keys(lance), lance.drop_columns(["_distance"]).to_pylist(), strict=True))
    first = many.filter(pa.compute.equal(many["query_index"], 0))
    for key, row in zip(_keys(first), first.drop_columns(["_distance", "query_index"])
                        .to_pylist(), strict=True):
        if key in by_key:
            assert row == by_key[key]
    # More than the index holds: every row once.
    everything = index.search(q[0], k=10_000, columns=KEYS)
    assert everything.num_rows == 6000 and len(set(_keys(everything))) == 6000


@pytest.mark.slow
def test_stale_ivf_is_not_used_and_a_new_build_replaces_it(built: tuple[Path, dict],
                                                            tmp_path: Path) -> None:
    root, data = built
    ix = tmp_path / "ix"
    shutil.copytree(root / "ix", ix)
    meta_file = ix / INDEX_META
    meta = json.loads(meta_file.read_text())
    old_folder = meta["ivf"]["folder"]
    # A table that moved on after the IVF was made (a build stopped before its metadata).
    meta["ivf"]["table_version"] -= 1
    meta_file.write_text(json.dumps(meta))
    index = SenseIndex(str(ix))
    assert index.ivf() is None
    assert isinstance(index.vector_query(_queries(data, 1), k=10, columns=KEYS), VectorSearch)
    # The next build makes it again, in a new folder; the old one goes a build later (a
    # reader of the version it replaced may still use it: publish.py).
    build_index(str(root / "ds"), "top", str(ix), kind="hnsw", compact=False)
    again = SenseIndex(str(ix))
    assert again.meta.ivf["table_version"] == again.table.version
    assert again.meta.ivf["folder"] != old_folder
    assert sorted(p.name for p in (ix / IVF_DIR).iterdir()) == sorted(
        [again.meta.ivf["folder"], old_folder])
    build_index(str(root / "ds"), "top", str(ix), kind="hnsw", compact=False)
    assert [p.name for p in (ix / IVF_DIR).iterdir()] == [again.meta.ivf["folder"]]
    assert isinstance(again.vector_query(_queries(data, 1), k=10, columns=KEYS), IvfSearch)


@pytest.mark.slow
def test_a_missing_file_falls_back_to_lancedb_and_the_next_build_makes_it_again(
        built: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, data = built
    ix = tmp_path / "ix"
    shutil.copytree(root / "ix", ix)
    folder = json.loads((ix / INDEX_META).read_text())["ivf"]["folder"]
    (ix / IVF_DIR / folder / "ivf.faiss").unlink()
    index = SenseIndex(str(ix))
    q = _queries(data, 1)
    assert isinstance(index.vector_query(q, k=10, columns=KEYS), VectorSearch)
    assert index.search(q[0], k=10, columns=KEYS).num_rows == 10
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "in-memory IVF unreadable" in line and "elmo index build" in line
    build_index(str(root / "ds"), "top", str(ix), kind="hnsw", compact=False)
    again = SenseIndex(str(ix))
    assert isinstance(again.vector_query(q, k=10, columns=KEYS), IvfSearch)
    assert (ix / IVF_DIR / again.meta.ivf["folder"] / "ivf.faiss").exists()


@pytest.mark.slow
def test_calibration_keeps_the_fewest_probes_that_reach_the_recall(
        built: tuple[Path, dict]) -> None:
    import fsspec

    root, _ = built
    index = SenseIndex(str(root / "ix"))
    held = index.meta.ivf
    fs = fsspec.filesystem("file")
    ivf = MemoryIvf.load(fs, str(root / "ix" / IVF_DIR / held["folder"]), held["nprobe"])
    rng = np.random.default_rng(0)
    nprobe, recall, queries = calibrate(ivf, rng)
    assert queries == 500 and recall >= CALIBRATION_RECALL
    steps = probe_steps(inverted(ivf.index).nlist)
    assert nprobe in steps and steps[-1] == inverted(ivf.index).nlist == 77
    if nprobe > steps[0]:  # one step fewer does not reach it
        fewer = steps[steps.index(nprobe) - 1]
        picks = np.sort(np.random.default_rng(0).choice(6000, 500, replace=False))
        q = unit_vectors(ivf.vectors[picks])
        truth = exact_nearest(ivf.vectors, q, 10, picks)
        found, _ = ivf.search(q, 10, nprobe=fewer, leave_out=picks)
        assert np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth,
                                                                   strict=True)]) \
            < CALIBRATION_RECALL
    # Probing every list with its own row left out gives the exact answer.
    picks = np.arange(0, 6000, 97)
    q = unit_vectors(ivf.vectors[picks])
    found, _ = ivf.search(q, 10, nprobe=inverted(ivf.index).nlist, leave_out=picks)
    truth = exact_nearest(ivf.vectors, q, 10, picks)
    assert np.mean([len(set(f) & set(t)) for f, t in zip(found, truth, strict=True)]) >= 9.9
    assert not np.any(found == picks[:, None])
    # Calibration scans the sketches once for all its probe counts: the same answers.
    sketched = ivf.sketch_candidates(q, 10, picks)
    for nprobe in (1, 4):
        alone = ivf.search(q, 10, nprobe=nprobe, leave_out=picks)
        reused = ivf.search(q, 10, nprobe=nprobe, leave_out=picks, sketched=sketched)
        assert np.array_equal(alone[0], reused[0]) and np.array_equal(alone[1], reused[1])


def test_calibration_leaves_the_sketches_out_only_where_the_lists_reach_the_recall(
        built: tuple[Path, dict]) -> None:
    """``sketches_optional``: lists that reach the recall alone leave the sketches out (a
    search then never scans them); lists that cannot keep them."""
    import faiss
    import fsspec

    root, _ = built
    held = SenseIndex(str(root / "ix")).meta.ivf
    fs = fsspec.filesystem("file")
    ivf = MemoryIvf.load(fs, str(root / "ix" / IVF_DIR / held["folder"]), held["nprobe"])
    _, recall, _ = calibrate(ivf, np.random.default_rng(0), sketches_optional=True)
    assert recall >= CALIBRATION_RECALL and not ivf.scan_sketches
    ivf.sketch = None  # a search that scanned the sketches would fail here
    ivf.search(unit_vectors(ivf.vectors[:3]), 10)

    # Lists of other rows' codes (each position holds a random vector): their candidates
    # are chance, so only the sketches can reach the recall.
    vectors = np.asarray(ivf.vectors, np.float32)
    dim = vectors.shape[1]
    other = unit_vectors(np.random.default_rng(5).standard_normal(vectors.shape)
                         .astype(np.float32))
    lists = faiss.index_factory(dim, "IVF16,SQ8", faiss.METRIC_INNER_PRODUCT)
    lists.train(other)
    lists.add(other)
    unit = unit_vectors(vectors)
    planes = Sketch.planes_for(dim)
    mean = unit.mean(axis=0)
    chance = MemoryIvf(lists, ivf.vectors, Sketch(planes, mean, Sketch.encode(unit, planes,
                                                                             mean)),
                       ivf.rows, 1)
    _, with_sketches, _ = calibrate(chance, np.random.default_rng(0), sketches_optional=True)
    assert chance.scan_sketches and with_sketches > 0.5
    picks = np.arange(0, 6000, 60)
    truth = exact_nearest(ivf.vectors, unit[picks], 10, picks)
    found, _ = chance.search(unit[picks], 10, nprobe=16, leave_out=picks,
                             sketched=[np.empty(0, np.int64)] * len(picks))
    alone = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)])
    assert alone < 0.2 < with_sketches - alone


@pytest.mark.parametrize("rows", [70_000, EXACT_BLOCK_ROWS + 3])
def test_exact_nearest_matches_numpy(rows: int) -> None:
    # Several blocks; and a last block of fewer rows than k.
    rng = np.random.default_rng(1)
    stored = (3 * rng.standard_normal((rows, 8))).astype(np.float16)
    unit = stored.astype(np.float32) / np.linalg.norm(stored.astype(np.float32), axis=1,
                                                      keepdims=True)
    leave_out = np.array([5, EXACT_BLOCK_ROWS + 1, rows - 1])
    q = unit[leave_out]
    got = exact_nearest(stored, q, 4, leave_out)
    sims = q @ unit.T
    sims[np.arange(3), leave_out] = -np.inf
    want = np.argsort(-sims, axis=1)[:, :4]
    assert [set(r) for r in got] == [set(r) for r in want]


@pytest.mark.slow
def test_stored_on_s3(built: tuple[Path, dict], s3_endpoint: str,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """On an object store the folder is made locally and uploaded; loading reads it into
    memory; other folders are removed."""
    root, data = built
    fs = moto_fs(s3_endpoint, monkeypatch)
    fs.mkdir("ivf-bucket")
    fs.pipe("ivf-bucket/ix/_ivf/v0-stale/ivf.faiss", b"left by a stopped build")
    index = SenseIndex(str(root / "ix"))
    held = build_ivf(index.table, fs, "ivf-bucket/ix")
    assert held["rows"] == 6000 and held["recall_at_10"] >= CALIBRATION_RECALL
    drop_other_folders(fs, "ivf-bucket/ix", held["folder"])
    assert fs.ls("ivf-bucket/ix/_ivf", detail=False) == [f"ivf-bucket/ix/_ivf/{held['folder']}"]
    remote = MemoryIvf.load(fs, f"ivf-bucket/ix/_ivf/{held['folder']}", held["nprobe"])
    local = index.ivf()
    assert local is not None and isinstance(remote.vectors, np.ndarray)
    q = _queries(data, 5)
    assert remote.nearest_rows(q, 10, KEYS).equals(local.nearest_rows(q, 10, KEYS))


@pytest.mark.slow
def test_a_grown_table_keeps_the_training_of_its_ivf(built: tuple[Path, dict],
                                                     tmp_path: Path) -> None:
    """New rows are encoded with the coarse centroids and codes the IVF was trained with,
    until the table outgrows them (RETRAIN_GROWTH); searches stay at the recall."""
    import faiss

    root, data = built
    ds = Path(shutil.copytree(root / "ds", tmp_path / "ds"))
    ix = tmp_path / "ix"
    record, kept = uncommit_shard_1(ds)
    build_index(str(ds), "top", str(ix), kind="hnsw", compact=False)
    first = SenseIndex(str(ix)).meta.ivf
    assert first is not None and first["trained_rows"] == first["rows"] < 6000

    def centroids(held: dict) -> np.ndarray:
        index = faiss.read_index(str(ix / IVF_DIR / held["folder"] / "ivf.faiss"))
        return index.quantizer.reconstruct_n(0, index.nlist)

    before = centroids(first)
    record.write_bytes(kept)  # shard 1 committed again: the table grows
    assert build_index(str(ds), "top", str(ix)).added_rows == 6000 - first["rows"]
    index = SenseIndex(str(ix))
    again = index.meta.ivf
    assert again["rows"] == 6000 and again["folder"] != first["folder"]
    assert again["trained_rows"] == first["rows"] and again["lists"] == first["lists"]
    np.testing.assert_array_equal(centroids(again), before)
    assert again["recall_at_10"] >= CALIBRATION_RECALL
    q = _queries(data, 20)
    exact = _exact(index, q, 10)
    found = [set(_keys(index.search(query, k=10, columns=KEYS))) for query in q]
    assert np.mean([len(f & e) / 10 for f, e in zip(found, exact, strict=True)]) >= 0.95
    # Past RETRAIN_GROWTH times the rows it was trained on, or with other codes, it is not
    # kept; within, it comes back empty and trained.
    fs, folder_root = fsspec.filesystem("file"), str(ix)
    grown = again["trained_rows"] * RETRAIN_GROWTH + 1
    assert trained_index(fs, folder_root, again, grown, DIM, "SQ8") is None
    assert trained_index(fs, folder_root, again, 6000, DIM, "PQ8") is None
    kept_index = trained_index(fs, folder_root, again, 6000, DIM, "SQ8")
    assert kept_index is not None and kept_index.is_trained and kept_index.ntotal == 0


@pytest.mark.slow
def test_metadata_written_with_held_still_reads(built: tuple[Path, dict], tmp_path: Path
                                                ) -> None:
    """``_elmo_index.json`` files written before the IVF's record was named ``ivf`` call it
    ``held``: they open with their IVF as before."""
    root, data = built
    ix = tmp_path / "ix"
    shutil.copytree(root / "ix", ix)
    meta = json.loads((ix / INDEX_META).read_text())
    meta["held"] = meta.pop("ivf")
    (ix / INDEX_META).write_text(json.dumps(meta))
    index = SenseIndex(str(ix))
    assert index.meta.ivf == meta["held"] and index.ivf() is not None
    assert isinstance(index.vector_query(_queries(data, 1), k=10, columns=KEYS), IvfSearch)
