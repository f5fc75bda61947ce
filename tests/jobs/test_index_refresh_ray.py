"""A job's index refresh on Ray (``[ray] address``): a compact index's per-shard work (the
new files' vectors, the shards' codes) runs as Ray tasks on a local two-node cluster
(``ray.cluster_utils.Cluster``), spread over both nodes, and the index is the one a
refresh in one process makes: the same shard files, byte for byte, and the same hits."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import local_ray_cluster, uncommit_shard_1
from synthetic_dataset import write_synthetic

from jobs.index_refresh import refresh_index, refresh_indexes
from jobs.spec import load_spec
from pipeline.lookup.index import ivf_shards_build
from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.ivf_search import IVF_DIR
from pipeline.lookup.index.ivf_shards import SHARD_FILES, TRAIN_FILES
from pipeline.lookup.index.meta import INDEX_META
from pipeline.lookup.index.sense_index import SenseIndex
from schemas.dataset import open_dataset, open_fs

DIM, ROWS = 32, 3_600  # three shard files of 1,200 rows
RECORD = ("rows", "lists", "codes", "trained_rows", "nprobe", "recall_at_10")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import logging

    import ray

    with local_ray_cluster(tmp_path_factory, head_cpus=1, worker_cpus=1) as address:
        # Joined once for the module: each refresh finds Ray joined (as in a job run on
        # Ray) and the workers that imported faiss serve the next refresh's tasks too.
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        try:
            yield address
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("refresh_ray") / "ds"
    write_synthetic(out, ROWS, DIM, n_shards=3, vocab=100)
    return out


@pytest.fixture(scope="module", autouse=True)
def one_faiss_thread() -> Iterator[None]:
    # The cluster's workers run on this machine's cores too: faiss's OpenMP threads in
    # this process would spin against them (minutes instead of seconds on a busy machine);
    # Ray gives each of its workers one thread already.
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.fixture(autouse=True)
def product_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Product-quantized codes from 1,000 rows on, so that a small table tests them.
    monkeypatch.setattr(ivf_shards_build, "PQ_MIN_ROWS", 1_000)


def _index(ix: Path) -> tuple[dict, dict[str, dict[str, bytes]], dict[str, bytes]]:
    """The IVF record's figures, each shard's files and the training's files."""
    record = json.loads((ix / INDEX_META).read_text())["ivf"]
    base = ix / IVF_DIR
    shards = {key: {name: (base / s["folder"] / name).read_bytes() for name in SHARD_FILES}
              for key, s in record["shards"].items()}
    train = {name: (base / record["train"] / name).read_bytes() for name in TRAIN_FILES}
    return {k: record[k] for k in RECORD}, shards, train


def _same_hits(a: Path, b: Path) -> None:
    one, other = SenseIndex(str(a)), SenseIndex(str(b))
    queries = np.random.default_rng(3).standard_normal((6, DIM)).astype(np.float32)
    keys = ("doc_id", "sent_idx", "tok_idx")
    for kw in ({}, {"exact": True}, {"words": ["w1"]}):
        want = one.vector_query(queries, k=8, columns=keys, **kw).to_arrow()
        got = other.vector_query(queries, k=8, columns=keys, **kw).to_arrow()
        assert got.select(list(keys)).to_pylist() == want.select(list(keys)).to_pylist(), kw
        np.testing.assert_array_equal(got["_distance"].to_numpy(),
                                      want["_distance"].to_numpy())


@pytest.mark.slow
def test_a_job_refresh_on_ray_builds_the_index_of_one_process(
        cluster: str, dataset: Path, tmp_path: Path) -> None:
    ds = Path(shutil.copytree(dataset, tmp_path / "ds"))
    spec_file = tmp_path / "job.toml"
    spec_file.write_text(f'source = "{tmp_path}/in/*.txt"\noutput = "{ds}"\n'
                         f'mixes = ["top"]\n[ray]\naddress = "{cluster}"\n')
    spec = load_spec(spec_file)
    assert spec.ray_address == cluster
    fs, root = open_fs(str(ds))
    # No index yet: the refresh builds it, its shards written and encoded by Ray tasks.
    results = refresh_indexes(spec, fs, root, {"main"})
    assert results["top"].startswith("refreshed: +3 files") and \
        results["top"].endswith("shard work on 2 Ray node(s)"), results
    local = tmp_path / "local"
    build_index(str(ds), "top", str(local), compact=True)
    on_ray = Path(spec.index_uri("top"))
    assert _index(on_ray) == _index(local)
    _same_hits(on_ray, local)


@pytest.mark.slow
def test_an_incremental_refresh_on_ray_adds_the_shard_one_process_adds(
        cluster: str, dataset: Path, tmp_path: Path) -> None:
    ds = Path(shutil.copytree(dataset, tmp_path / "ds"))
    record, kept = uncommit_shard_1(ds)
    here, there = tmp_path / "here", tmp_path / "there"
    build_index(str(ds), "top", str(here), compact=True)  # shards 0 and 2
    shutil.copytree(here, there)
    record.write_bytes(kept)  # shard 1 committed: the delta to add
    added = [f.path for f in open_dataset(str(ds)).shard_files("tokens") if "shard=1" in f.key]
    assert len(added) == 1
    summary = refresh_index(str(ds), mix="top", index_uri=str(there), add_files=added,
                            ray_address=cluster)
    assert summary.ray_nodes >= 1 and summary.added_rows == ROWS // 3
    assert refresh_index(str(ds), mix="top", index_uri=str(here), add_files=added
                         ).ray_nodes == 0
    figures, shards, train = _index(there)
    assert (figures, shards, train) == _index(here) and len(shards) == 3
    _same_hits(there, here)
