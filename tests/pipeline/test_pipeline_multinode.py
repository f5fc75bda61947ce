"""A multi-node Ray cluster on one machine (``ray.cluster_utils.Cluster``: a head and two
worker nodes): a worker node is removed mid-job, the job finishes, and the dataset equals
an uninterrupted local run's."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_dataset, config

from pipeline.write.embed import embed_corpus

pytestmark = [pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    import logging

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    # A short temp dir: Ray's socket paths must stay under the 107-byte AF_UNIX limit.
    # Every node's files (and the cluster address file) under it, not /tmp/ray.
    temp = tmp_path_factory.mktemp("rc")
    (temp / "ray").mkdir()
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    # The head holds no CPU: every actor lands on a worker node, which the test removes.
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    workers = [made.add_node(num_cpus=2) for _ in range(2)]
    made.wait_for_nodes()
    ray.init(address=made.address, logging_level=logging.WARNING, log_to_driver=False)
    made.workers = workers  # type: ignore[attr-defined]
    try:
        yield made
    finally:
        ray.shutdown()
        made.shutdown()


def _corpus(folder: Path) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(3)
    words = ["alpha", "beta", "gamma.", "Delta", "eps,", "river", "bank", "Otters"]
    for name in ("one.txt", "two.txt"):
        lines = [" ".join(rng.choice(words, 30)) + f" n{i}." for i in range(1500)]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


def test_removing_a_worker_node_mid_job_loses_and_doubles_nothing(
        cluster: object, tiny_model_dir: Path, tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus")
    clean, moved = tmp_path / "clean", tmp_path / "moved"
    kw = {"min_items": 24}
    embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], clean, **kw))

    removed: dict[str, object] = {}
    manifest = moved / "_manifest" / "main"

    def remove_a_busy_node() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for entry in sorted(manifest.glob("shard=*.json")):
                node = json.loads(entry.read_text())["worker"]["node"]
                victim = next((w for w in cluster.workers if w.node_id == node), None)  # type: ignore[attr-defined]
                if victim is not None:
                    removed["committed"] = len(list(manifest.glob("shard=*.json")))
                    cluster.remove_node(victim)  # type: ignore[attr-defined]
                    removed["node"] = node
                    return
            time.sleep(0.01)

    killer = threading.Thread(target=remove_a_busy_node)
    killer.start()
    summary = embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], moved, executor="ray",
                                  actors=2, cpus_per_actor=1, **kw))
    killer.join()
    assert "node" in removed, "no item was committed: the node was never removed"
    assert removed["committed"] < summary.items_written, "the node went after the job ended"
    entries = [json.loads(p.read_text()) for p in manifest.glob("shard=*.json")]
    nodes = {e["worker"]["node"] for e in entries}
    assert len(nodes) >= 2 and removed["node"] in nodes  # work ran on more than one node
    assert_same_dataset(clean, moved)
    tokens = pq.read_table(moved / "tokens").to_pandas()
    assert not tokens.duplicated(["doc_id", "sent_idx", "tok_idx"]).any()
    assert len(tokens) == summary.totals["tokens"]
    assert not (moved / "_staging").exists()
