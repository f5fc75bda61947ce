"""A compact index's IVF in shards (``pipeline/lookup/ivf_shards*.py``): one folder per
dataset file, codes held and vectors mapped; a build whose training sample is bounded,
that checks it fits before it starts, and that a kill leaves the previous index usable;
a missing shard named with the command that makes it again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import uncommit_shard_1

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index import ivf_shards_build
from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.ivf_search import IVF_DIR
from pipeline.lookup.index.ivf_shards import (
    CODE_BYTES,
    MEMORY_BYTES_PER_ROW,
    SENTENCES_FILE,
    SHARD_FILES,
    SHARDS_FORMAT,
    VECTORS_FILE,
    ShardedIvf,
)
from pipeline.lookup.index.projection import VALUES_PER_CODE_BYTE, inverted
from pipeline.lookup.index.sense_index import SenseIndex, read_meta

DIM = 64
ROWS = 4_000
KEYS = ("doc_id", "sent_idx", "tok_idx")


@pytest.fixture(scope="module", autouse=True)
def product_codes_from_few_rows() -> object:
    """Product-quantized codes from 1,000 rows on (the product asks 9,984: 39 points for
    each of 256 centroids), so that small tables test them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ivf_shards_build, "PQ_MIN_ROWS", 1_000)
        yield


@pytest.fixture(scope="module")
def built(sharded_index: Path) -> Path:
    return sharded_index


def _keys(table) -> list[tuple]:
    return list(zip(*(table[c].to_pylist() for c in KEYS), strict=True))


@pytest.mark.slow
def test_one_shard_per_file_codes_held_vectors_mapped(built: Path) -> None:
    index = SenseIndex(str(built / "ix"))
    held = index.meta.ivf
    assert held["format"] == SHARDS_FORMAT and list(held["shards"]) == index.meta.indexed
    # DIM is one DIM_STEP: every direction kept, two values a code byte.
    assert held["projected_dim"] == DIM and held["rows"] == ROWS
    assert held["codes"] == f"PQ{min(CODE_BYTES, DIM // VALUES_PER_CODE_BYTE)}"
    assert sum(s["rows"] for s in held["shards"].values()) == ROWS
    assert held["recall_at_10"] >= 0.95
    for shard in held["shards"].values():
        folder = built / "ix" / IVF_DIR / shard["folder"]
        # a float16 dataset: its vectors are an int8 copy in the shard (row_vectors)
        assert sorted(p.name for p in folder.iterdir()) == sorted([*SHARD_FILES,
                                                                    VECTORS_FILE,
                                                                    SENTENCES_FILE])
    ivf = index.ivf()
    assert isinstance(ivf, ShardedIvf)
    # Opening it read no vectors and no codes: the vectors are mapped per read, the
    # codes wait.
    assert all(f.path.endswith(VECTORS_FILE) and f.offsets is None
               for f in ivf.vectors.files)
    assert ivf._index is None
    ivf.search(np.ones((1, DIM), np.float32), 3)
    # What it holds per row: the code, faiss's id, the sketch.
    assert inverted(ivf.index).code_size + 8 + ivf.sketch.code_bytes <= MEMORY_BYTES_PER_ROW


@pytest.mark.slow
def test_search_matches_the_exact_answer(built: Path) -> None:
    index = SenseIndex(str(built / "ix"))
    ivf = index.ivf()
    rng = np.random.default_rng(4)
    recall = []
    for query in rng.standard_normal((20, DIM)).astype(np.float32) + \
            np.asarray(ivf.vectors[rng.choice(ROWS, 20)], np.float32):
        got = index.search(query, k=10, columns=KEYS)
        exact = index.search(query, k=10, columns=KEYS, exact=True)
        recall.append(len(set(_keys(got)) & set(_keys(exact))) / 10)
    assert np.mean(recall) >= 0.95
    # A filtered search: the LanceDB rows' keys find their positions.
    got = index.search(query, k=5, words=["w1"], columns=[*KEYS, "token"])
    assert set(got["token"].to_pylist()) == {"w1"} and got.num_rows == 5


@pytest.mark.slow
def test_a_grown_dataset_adds_a_shard_and_keeps_the_others(built: Path, tmp_path: Path
                                                           ) -> None:
    ds = Path(shutil.copytree(built / "ds", tmp_path / "ds"))
    record, kept = uncommit_shard_1(ds)
    ix = tmp_path / "ix"
    build_index(str(ds), "top", str(ix))
    first = read_meta(str(ix)).ivf
    record.write_bytes(kept)
    build_index(str(ds), "top", str(ix))
    again = read_meta(str(ix)).ivf
    # Training kept (within RETRAIN_GROWTH), the first shard's folder kept as it was.
    assert again["train"] == first["train"] and len(again["shards"]) == 2
    (key, shard), = first["shards"].items()
    assert again["shards"][key] == shard
    assert sorted(p.name for p in (ix / IVF_DIR).iterdir()) == sorted(
        [again["train"], *(s["folder"] for s in again["shards"].values())])


@pytest.mark.slow
def test_a_build_killed_half_way_leaves_the_previous_index(built: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    ds = Path(shutil.copytree(built / "ds", tmp_path / "ds"))
    record, kept = uncommit_shard_1(ds)
    ix = tmp_path / "ix"
    build_index(str(ds), "top", str(ix))
    query = np.ones(DIM, np.float32)
    before = SenseIndex(str(ix)).search(query, k=5, words=["w1"], columns=KEYS)
    record.write_bytes(kept)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ivf_shards_build, "calibrate", killed)
    with pytest.raises(KeyboardInterrupt):
        build_index(str(ds), "top", str(ix))
    monkeypatch.undo()
    # The table took the new file's rows; the index reads it as the IVF was made.
    index = SenseIndex(str(ix))
    assert index.search(query, k=5, words=["w1"], columns=KEYS).equals(before)
    assert len(index.meta.ivf["shards"]) == 1
    build_index(str(ds), "top", str(ix))
    assert SenseIndex(str(ix)).meta.rows == ROWS


@pytest.mark.slow
def test_a_missing_shard_names_the_build_that_makes_it(built: Path, tmp_path: Path) -> None:
    ix = Path(shutil.copytree(built / "ix", tmp_path / "ix"))
    held = read_meta(str(ix)).ivf
    key, shard = next(iter(held["shards"].items()))
    (ix / IVF_DIR / shard["folder"] / VECTORS_FILE).unlink()
    with pytest.raises(ElmoUserError, match=rf"index shard {key} .*lacks vectors.npy; "
                                            r"`elmo index build .* makes it again"):
        SenseIndex(str(ix)).search(np.ones(DIM, np.float32), k=3)
    # The build makes that shard again, and only that one.
    build_index(str(built / "ds"), "top", str(ix))
    again = read_meta(str(ix)).ivf
    assert again["shards"][key]["folder"] != shard["folder"]
    assert SenseIndex(str(ix)).search(np.ones(DIM, np.float32), k=3).num_rows == 3


@pytest.mark.slow
def test_a_build_that_would_not_fit_says_so_first(built: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ivf_shards_build, "free_memory", lambda: 1 << 20)
    with pytest.raises(ElmoUserError, match=r"4,000 rows needs about .* GiB of memory.*"
                                            r"GiB are free.*--words"):
        build_index(str(built / "ds"), "top", str(tmp_path / "ix"))
    assert not (tmp_path / "ix" / IVF_DIR).exists() or \
        not any((tmp_path / "ix" / IVF_DIR).iterdir())


def test_memory_bound_follows_the_sample_not_the_rows() -> None:
    """The training sample stops growing at TRAIN_MAX_ROWS: what a build needs beyond
    it is the codes, MEMORY_BYTES_PER_ROW a row."""
    from pipeline.lookup.index.ivf_shards_build import TRAIN_MAX_ROWS, bytes_needed, train_rows_for

    assert train_rows_for(10**8, 4096, "PQ64") == TRAIN_MAX_ROWS
    big, bigger = bytes_needed(10**7, 1024), bytes_needed(2 * 10**7, 1024)
    assert bigger - big == 2 * 10**7 * MEMORY_BYTES_PER_ROW


@pytest.mark.slow
def test_a_stale_shard_is_named_not_left_out(built: Path, tmp_path: Path) -> None:
    """The table holds rows of a file the IVF's record no longer lists (an IVF older than
    its table): a filtered search names that shard instead of leaving its rows out."""
    import json

    from pipeline.lookup.index.meta import INDEX_META

    ix = Path(shutil.copytree(built / "ix", tmp_path / "ix"))
    meta = json.loads((ix / INDEX_META).read_text())
    key = list(meta["ivf"]["shards"])[-1]
    del meta["ivf"]["shards"][key]
    (ix / INDEX_META).write_text(json.dumps(meta))
    part, shard, _ = key.split("/")
    stale = rf"index shard {part}/{shard} is missing or stale .*`elmo index build .* makes it"
    index = SenseIndex(str(ix))
    with pytest.raises(ElmoUserError, match=stale):
        index.search(np.ones(DIM, np.float32), k=3, words=["w1"], columns=KEYS)
    with pytest.raises(ElmoUserError, match=stale):
        index.occurrences(["w1"], columns=KEYS)


@pytest.mark.slow
def test_training_reports_each_round_and_trains_as_faiss(tmp_path: Path) -> None:
    """The training's progress steps (coarse k-means rounds, then each sub-quantizer) are
    ``train_steps``, and the coarse centroids are those of faiss's own one-call training."""
    import faiss

    from pipeline.lookup.index.ivf_shards import TRAIN_FILE
    from pipeline.lookup.index.ivf_shards_build import train, train_steps

    rng = np.random.default_rng(2)
    sample = rng.standard_normal((2_000, 32)).astype(np.float32)
    sample /= np.linalg.norm(sample, axis=1, keepdims=True)
    for codes in ("PQ16", "SQ8"):
        steps: list[int] = []
        mine = sample.copy()  # train overwrites it with its residuals (no copy of its own)
        # The identity projection: the IVF behind it trains on the sample as given.
        train(str(tmp_path / codes), mine, 20, codes, np.eye(32, dtype=np.float32),
              sample.mean(axis=0), steps.append)
        assert sum(steps) == train_steps(codes, 32) >= 10
        stored = faiss.read_index(str(tmp_path / codes / TRAIN_FILE))
        transform = faiss.downcast_VectorTransform(stored.chain.at(0))
        assert np.array_equal(faiss.vector_to_array(transform.A), np.eye(32).ravel())
        ours = inverted(stored)
        theirs = faiss.index_factory(32, f"IVF20,{codes}", faiss.METRIC_INNER_PRODUCT)
        theirs.cp.min_points_per_centroid = 1
        if codes.startswith("PQ"):  # as ``train`` sets them
            theirs.do_polysemous_training = False
            theirs.pq.cp.min_points_per_centroid = 1
        theirs.train(sample)
        coarse = [faiss.rev_swig_ptr(faiss.downcast_index(i.quantizer).get_xb(), 20 * 32)
                  for i in (ours, theirs)]
        assert np.array_equal(coarse[0], coarse[1]) and ours.is_trained
        if codes.startswith("PQ"):
            # The codebooks: faiss's own product quantizer trained on the residuals.
            centroids = coarse[0].reshape(20, 32)
            _, assigned = ours.quantizer.search(sample, 1)
            pq = faiss.ProductQuantizer(32, 16, 8)
            pq.cp.min_points_per_centroid = 1
            pq.cp.max_points_per_centroid = ivf_shards_build.PQ_TRAIN_POINTS_PER_CENTROID
            pq.cp.niter = ivf_shards_build.PQ_TRAIN_ROUNDS
            pq.train(sample - centroids[assigned[:, 0]])
            assert np.allclose(faiss.vector_to_array(pq.centroids),
                               faiss.vector_to_array(faiss.downcast_index(ours).pq.centroids),
                               atol=1e-5)


@pytest.mark.slow
def test_a_filtered_search_reads_only_its_rows_codes_and_answers_the_same(built: Path
                                                                          ) -> None:
    """Before the codes are loaded, a search among some rows (a word's) builds an IVF of
    their codes only; loaded, the same search filters every row's: the same answer."""
    rng = np.random.default_rng(6)
    among = np.sort(rng.choice(ROWS, 1_500, replace=False))
    fresh = SenseIndex(str(built / "ix")).ivf()
    queries = np.asarray(fresh.vectors[rng.choice(ROWS, 8)], np.float32) + \
        rng.standard_normal((8, DIM)).astype(np.float32)
    got = fresh.search(queries, 10, among=among)
    assert fresh._index is None  # no code of another row was read
    assert np.isin(got[0], among).all()
    loaded = SenseIndex(str(built / "ix")).ivf()
    assert loaded.index.ntotal == ROWS  # every row's codes, filtered by a selector
    want = loaded.search(queries, 10, among=among)
    assert np.array_equal(got[0], want[0]) and np.allclose(got[1], want[1])


@pytest.mark.slow
def test_a_word_search_needs_no_lancedb_and_finds_what_a_lance_filter_finds(built: Path
                                                                            ) -> None:
    """A compact index's word search (and a word's occurrences, for its senses) takes the
    word's rows from the shards' ``rows.arrow`` and the sentences from their
    ``sentences.arrow``: the process never imports LanceDB, and the hits and uses
    (sentences and vectors included) are those of the same filter run by LanceDB."""
    import json
    import subprocess
    import sys

    from pipeline.lookup.index.meta import RESULT_COLUMNS
    from pipeline.lookup.index.sentences import with_sentences

    query = np.random.default_rng(8).standard_normal(DIM).astype(np.float32)
    child = f"""
import json, sys
import numpy as np
from pipeline.lookup.index.sense_index import SenseIndex
index = SenseIndex({str(built / "ix")!r})
hits = index.search(np.array({query.tolist()}, np.float32), k=8, words=["w1", "w7"])
uses = index.occurrences(["w1", "w7"], columns=["doc_id", "sent_idx", "tok_idx", "sentence"])
print(json.dumps({{"lancedb": "lancedb" in sys.modules, "hits": hits.to_pylist(),
                  "uses": uses.drop_columns(["vector"]).to_pylist(),
                  "vectors": np.asarray(uses["vector"].to_pylist(), np.float64).tolist()}}))
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         check=True)
    answer = json.loads(out.stdout)
    assert answer["lancedb"] is False
    index = SenseIndex(str(built / "ix"))
    # "AND (true)": the same rows, but a filter only LanceDB can evaluate.
    lance = index.search(query, k=8, words=["w1", "w7"], where="true")
    assert index._tables is not None  # it did go through LanceDB
    assert [{c: h[c] for c in (*RESULT_COLUMNS, "_distance")} for h in answer["hits"]] \
        == lance.to_pylist()
    assert {h["token"].lower() for h in answer["hits"]} <= {"w1", "w7"}
    # The texts are the sentences table's.
    keys = lance.select(["doc_id", "sent_idx"])
    assert lance["sentence"].to_pylist() \
        == with_sentences(index.sentences, keys)["sentence"].to_pylist()
    assert [h["sentence"].split(":")[0] for h in answer["hits"]] \
        == [f"{h['doc_id']}.{h['sent_idx']}" for h in answer["hits"]]
    # Every use of the words, each row with its own vector, as LanceDB's filter finds them.
    uses = index.occurrences(["w1", "w7"], columns=["doc_id", "sent_idx", "tok_idx",
                                                    "sentence"], where="true")
    mine = sorted(zip(map(json.dumps, answer["uses"]), map(tuple, answer["vectors"]),
                      strict=True))
    theirs = sorted(zip(map(json.dumps, uses.drop_columns(["vector"]).to_pylist()),
                        (tuple(np.asarray(v, np.float64)) for v in uses["vector"].to_pylist()),
                        strict=True))
    assert len(mine) == uses.num_rows > 20 and mine == theirs
