"""``elmo serve --ray-address CLUSTER --shard-actors 2`` on a local two-node Ray cluster
(``ray.cluster_utils.Cluster``): a compact index's shards are held by two actors, one a
node, and the Ray Serve replica sends its searches there (``ivf_ray.RayIvf``, the scatter
and gather of ``elmo senses search --ray-address``), opening no shard itself. Over HTTP,
the answers are those of one process searching the same index."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import local_ray_cluster
from serve_helpers import (
    Served,
    elmo_serve_argv,
    free_port,
    running_server,
    serve_env,
    served_compact_index,
    served_data,
)

SENTENCE = "Will you play upon this pipe ?"
KEYS = ("doc_id", "sent_idx", "tok_idx")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Served:
    base = served_data(tmp_path_factory)
    return Served(base.dataset, served_compact_index(tmp_path_factory))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # Two shard actors of one CPU start first, spread over the nodes; the replica's CPU is
    # then the head's second (one node with a replica: one Serve proxy on the port).
    with local_ray_cluster(tmp_path_factory, head_cpus=2, worker_cpus=1) as address:
        yield address


def _keys(hits: list[dict]) -> list[tuple]:
    return [tuple(h[k] for k in KEYS) for h in hits]


@pytest.mark.slow
def test_a_replica_searches_through_shard_actors_as_one_process(
        cluster: str, data: Served, tmp_path: Path) -> None:
    from pipeline.lookup.doc_fields import parse_where
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.senses.clusters import cluster_senses
    from pipeline.lookup.senses.search import search_senses

    one = SenseIndex(str(data.index))
    with running_server(data, "--ray-address", cluster, "--shard-actors", "2",
                        log=tmp_path / "server.log") as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        index = client.get("/info").json()["indexes"][0]
        # Two actors on two nodes hold the shards; the replica holds none.
        assert index["shard_actors"] == {"actors": 2, "nodes": 2}
        for ask, match in (({"word": "play", "k": 5}, "forms"),
                           ({"word": "play", "k": 7, "any_word": True}, "any"),
                           ({"word": "pipe", "k": 3, "where": ["source~shakespeare"]},
                            "forms")):
            found = client.post("/senses/search", json={"sentence": SENTENCE, **ask})
            assert found.status_code == 200, found.text
            hits = found.json()["hits"]
            want = search_senses(one, SENTENCE, ask["word"], k=ask["k"], match=match,
                                 filters=parse_where(ask["where"][0]) if "where" in ask
                                 else None)
            assert _keys(hits) == [(h.doc_id, h.sent_idx, h.tok_idx) for h in want], ask
            assert [round(h["similarity"], 4) for h in hits] == \
                [round(h.similarity, 4) for h in want]
            assert len(hits) == ask["k"] or "where" in ask
        # A word's senses take its rows' vectors from the actors.
        senses = client.get("/senses/play", params={"k": 2})
        assert senses.status_code == 200, senses.text
        local = cluster_senses(one, ["play"], k=2)
        assert senses.json()["rows"] == local.n_rows
        assert sorted(c["size"] for c in senses.json()["clusters"]) == \
            sorted(c.size for c in local.clusters)


@pytest.mark.slow
def test_shard_actors_refuse_a_full_index_and_a_silent_address(
        cluster: str, data: Served, tmp_path: Path) -> None:
    full = Served(data.dataset, data.index.parent / "index")  # served_data's flat index
    for extra, said in (
            (("--ray-address", cluster, "--shard-actors", "1"),
             "is not a compact index in shards, which Ray actors search; `elmo index build"),
            (("--ray-address", f"127.0.0.1:{free_port()}", "--shard-actors", "1"),
             "no Ray cluster answers at 127.0.0.1:"),
            (("--shard-actors", "2"), "--shard-actors needs --ray-address"),
            (("--ray-address", cluster, "--shard-actors", "0"),
             "--shard-actors must be auto or a number of at least 1")):
        done = subprocess.run(elmo_serve_argv(full, free_port(), *extra, "--no-verify"),
                              env=serve_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and said in done.stderr, (extra, done.stderr[-1500:])
        assert "Traceback" not in done.stderr, done.stderr[-1500:]
