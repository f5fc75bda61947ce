"""A compact index searched by Ray actors on a local two-node cluster
(``ray.cluster_utils.Cluster``, one CPU a node): each actor holds some of the shards, on
its own node, and the gathered hits are one process's (``pipeline/lookup/index/ivf_ray.py``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from synthetic_dataset import write_synthetic

from elmo_model.errors import ElmoUserError, SettingError, cli_flag
from pipeline.lookup.index import ivf_ray, ivf_search
from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.ivf_ray import scatter, split_shards
from pipeline.lookup.index.ivf_search import IVF_DIR
from pipeline.lookup.index.ivf_shards import VECTORS_FILE
from pipeline.lookup.index.meta import INDEX_META
from pipeline.lookup.index.sense_index import SenseIndex

DIM = 64
ROWS = 4_000  # conftest.sharded_index: two shard files, one an actor
KEYS = ("doc_id", "sent_idx", "tok_idx")


@pytest.fixture(scope="module")
def built(sharded_index: Path) -> Path:
    return sharded_index


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    # A short temp dir: Ray's socket paths must stay under the 107-byte AF_UNIX limit.
    temp = tmp_path_factory.mktemp("rc")
    (temp / "ray").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", str(temp))
        made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        made.add_node(num_cpus=1)
        made.wait_for_nodes()
        ray.init(address=made.address, logging_level=logging.WARNING, log_to_driver=False)
        try:
            yield made.address
        finally:
            ray.shutdown()
            made.shutdown()


def _hits(table) -> tuple[list[tuple], np.ndarray]:
    keys = list(zip(*(table[c].to_pylist() for c in KEYS), strict=True))
    return keys, table["_distance"].to_numpy()


@pytest.mark.slow
def test_actors_on_two_nodes_give_the_hits_of_one_process(
        cluster: str, built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = SenseIndex(str(built / "ix"))
    spread = SenseIndex(str(built / "ix"))
    ivf = scatter(spread, cluster)
    # One actor a node, each holding one of the two shards.
    assert len(ivf.actors) == 2 and len(set(ivf.nodes)) == 2
    local = one.ivf()
    rng = np.random.default_rng(7)
    queries = np.asarray(local.vectors[rng.choice(ROWS, 12)], np.float32) + \
        0.3 * rng.standard_normal((12, DIM)).astype(np.float32)
    for i, query in enumerate(queries):
        # Through the lists and sketches, exactly, and filtered by a word (ranked exactly).
        for kw in ({}, {"exact": True}, {"words": [f"w{i + 1}"]}, {"words": ["w1", "w2"]}):
            with monkeypatch.context() as patch:
                if len(kw.get("words", ())) > 1:
                    # A filter of more rows than are ranked exactly: the lists and sketches
                    # restricted to its rows, on each actor.
                    for module in (ivf_ray, ivf_search):
                        patch.setattr(module, "EXACT_FILTER_ROWS", 10)
                want = _hits(one.search(query, k=10 + i, columns=KEYS, **kw))
                got = _hits(spread.search(query, k=10 + i, columns=KEYS, **kw))
            assert got[0] == want[0], (i, kw)
            np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-6)
    # Many queries in one call: a query_index column, as LanceDB's and one process's.
    want = one.vector_query(queries, k=5, columns=KEYS).to_arrow()
    got = spread.vector_query(queries, k=5, columns=KEYS).to_arrow()
    assert got["query_index"].to_pylist() == want["query_index"].to_pylist()
    assert _hits(got)[0] == _hits(want)[0]
    # A word's occurrences with their vectors (what a sense map and the server's exact
    # search read): the vectors gathered from the actors that hold them.
    for words in (["w1"], ["w2", "w3"]):
        want = one.occurrences(words, columns=KEYS)
        got = spread.occurrences(words, columns=KEYS)
        assert got.num_rows == want.num_rows > 0 and got.equals(want), words
    ivf.close()  # its actors' CPUs back to the cluster
    # A shard gone from the disk: the actor holding it names it and the build.
    broken = Path(shutil.copytree(built / "ix", tmp_path / "broken"))
    record = json.loads((broken / INDEX_META).read_text())["ivf"]
    key, shard = list(record["shards"].items())[-1]
    (broken / IVF_DIR / shard["folder"] / VECTORS_FILE).unlink()
    with pytest.raises(ElmoUserError, match=rf"index shard {key} .*lacks vectors.npy; "
                                            r"`elmo index build .* makes it again"):
        scatter(SenseIndex(str(broken)), cluster)


def test_shards_split_by_rows() -> None:
    assert split_shards([100, 10, 60, 50], 2) == [[0, 1], [2, 3]]
    assert split_shards([5, 5, 5], 8) == [[0], [1], [2]]
    with pytest.raises(SettingError, match=r"^ray_actors must be at least 1") as caught:
        split_shards([5], 0)
    assert caught.value.named(cli_flag).startswith("--ray-actors must")  # as the CLI says it


def test_a_full_index_is_refused_before_ray_starts(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "ds", 300, 16, n_shards=1, vocab=20)
    build_index(str(tmp_path / "ds"), "top", str(tmp_path / "ix"), kind="flat",
                compact=False)
    with pytest.raises(ElmoUserError, match=r"not a compact index in shards.*--rebuild"):
        scatter(SenseIndex(str(tmp_path / "ix")), "local")
