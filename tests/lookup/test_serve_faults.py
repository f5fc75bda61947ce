"""``elmo serve`` under faults (issue 50): /sql keeps the server's paths to itself, a byte
that rots under a running server is not served as data, a relabelled or damaged derived
table is followed, and what a hostile client can make the server hold is bounded."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import httpx
import pyarrow.parquet as pq
import pytest
from helpers import REPO, flip_keeping_mtime, layer_page_offset
from serve_helpers import Served, memory_mb, running_server, served_data, server_pid

from schemas.user_cache import cache_dir

PATH_PROBES = [
    "SELECT * FROM duckdb_settings()", "SELECT * FROM duckdb_settings",
    "SELECT * FROM duckdb_databases()", "SELECT * FROM duckdb_databases",
    "SELECT current_setting('temp_directory')", "SELECT current_setting('home_directory')",
    "SELECT current_setting('extension_directory')", "SELECT sql FROM duckdb_views()",
    "SELECT * FROM duckdb_views", "SELECT * FROM duckdb_extensions()",
    "SELECT * FROM glob('*')", "SELECT * FROM read_text('README.md')",
    "SELECT * FROM pragma_database_list", "SELECT * FROM duckdb_temporary_files()",
    "SELECT getenv('HOME')", "SELECT * FROM query('SELECT * FROM duckdb_settings()')",
    "EXPLAIN SELECT * FROM tokens", "EXPLAIN ANALYZE SELECT count(*) FROM tokens",
    "SELECT * FROM information_schema.tables", "SELECT * FROM nowhere",
    "SELECT * FROM tokens WHERE nope = 1",
]


@pytest.fixture(scope="module")
def copied(tmp_path_factory: pytest.TempPathFactory) -> Served:
    """The served dataset copied (tests damage it), with the session's index."""
    data = served_data(tmp_path_factory)
    root = tmp_path_factory.mktemp("serve_faults")
    shutil.copytree(data.dataset, root / "dataset")
    return Served(root / "dataset", data.index)


@pytest.fixture(scope="module")
def server(copied: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve_faults_log") / "server.log"
    with running_server(copied, log=log) as url:
        yield url
        assert "Traceback" not in log.read_text()


def _server_paths(copied: Served) -> list[str]:
    return [str(copied.dataset.resolve()), str(REPO), os.path.expanduser("~"),
            tempfile.gettempdir(), sys.prefix, str(cache_dir())]


def test_sql_does_not_reveal_the_servers_paths(server: str, copied: Served) -> None:
    paths = _server_paths(copied)
    with httpx.Client(base_url=server, timeout=60) as client:
        for query in PATH_PROBES:
            response = client.post("/sql", json={"query": query})
            assert response.status_code in (200, 400), (query, response.text[:300])
            text = response.text
            assert not [p for p in paths if p in text], (query, text[:500])
        # The views still answer, and a refusal says why in one line.
        ok = client.post("/sql", json={"query": "SELECT count(*) AS n FROM tokens"})
        assert ok.status_code == 200 and ok.json()["rows"][0][0] > 0
        refused = client.post("/sql", json={"query": "SELECT * FROM duckdb_settings()"})
        assert refused.status_code == 400 and "not served here" in refused.json()["error"]


def test_a_byte_rotted_under_a_running_server_is_not_served(server: str,
                                                            copied: Served) -> None:
    query = {"query": "SELECT sum(list_sum(layer_2)) AS s FROM tokens"}
    with httpx.Client(base_url=server, timeout=60) as client:
        first = client.post("/sql", json=query)
        assert first.status_code == 200, first.text
        target = sorted((copied.dataset / "tokens").glob("shard=*/*.parquet"))[0]
        original = target.read_bytes()
        flip_keeping_mtime(target, layer_page_offset(target, "layer_2"))
        try:
            again = client.post("/sql", json=query)
            assert again.status_code == 400, again.text
            message = again.json()["error"]
            assert "corrupt" in message and target.name in message and "\n" not in message
            assert str(copied.dataset.resolve()) not in message
            assert client.get("/info").status_code == 200
        finally:
            target.write_bytes(original)
        assert client.post("/sql", json=query).json() == first.json()


@pytest.mark.slow
def test_sql_follows_the_derived_registry(server: str, copied: Served) -> None:
    """A word labelled while the server runs is queryable at the next /sql; a missing
    derived file fails only queries of its table."""
    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.senses.labels import label_words

    index = copied.dataset.parent / "ix"
    if not (index / "_elmo_index.json").exists():
        build_index(str(copied.dataset), "top", str(index), kind="flat", compact=False)
    label_words(str(index), ["play"], k=2)
    count = {"query": "SELECT count(*) AS n FROM senses WHERE word = 'play'"}
    with httpx.Client(base_url=server, timeout=60) as client:
        labelled = client.post("/sql", json=count)
        assert labelled.status_code == 200 and labelled.json()["rows"][0][0] > 0
        entry = json.loads((copied.dataset / "_derived.json").read_text())
        path = copied.dataset / entry["tables"]["senses"]["play"]["path"]
        kept = path.read_bytes()
        path.unlink()
        try:
            broken = client.post("/sql", json=count)
            assert broken.status_code == 400
            assert "elmo senses label play" in broken.json()["error"]
            tokens = client.post("/sql", json={"query": "SELECT count(*) FROM tokens"})
            assert tokens.status_code == 200
        finally:
            path.write_bytes(kept)
        assert pq.read_metadata(path).num_rows == labelled.json()["rows"][0][0]


@pytest.mark.slow
def test_the_layer_cache_is_bounded_in_bytes() -> None:
    """Long distinct sentences (what a hostile client sends) are not all kept."""
    import elmo_model
    from pipeline.lookup.serve.batching import LayerCache

    model = REPO / "models" / "default"
    embedder = elmo_model.load(str(model / "options.json"),
                               str(model / "weights.safetensors"), mode="stateless",
                               device="cpu")
    one = embedder.embed([["word"] * 200])[0].nbytes
    cache = LayerCache(embedder, size=1_000, max_bytes=3 * one)
    for n in range(8):
        layers = cache.embed([[f"w{n}"] + ["word"] * 199])
        assert layers[0].nbytes == one
        assert cache.bytes <= 3 * one and len(cache.kept) <= 3
    assert cache.bytes == sum(a.nbytes for a in cache.kept.values())


def _server_rss_mb(url: str) -> float:
    """Resident memory of the ``elmo serve`` process listening at ``url``."""
    return memory_mb(server_pid(url))


@pytest.mark.slow
def test_embed_answers_are_bounded_and_the_server_stays_small(server: str) -> None:
    """64 sentences of 660 tokens made a 452 MB /embed answer and +480 MB of server memory
    per request; now a request holds at most MAX_EMBED_TOKENS tokens."""
    from pipeline.lookup.serve.limits import MAX_EMBED_TOKENS, MAX_SENTENCE_CHARS

    long = ("to be or not " * 200)[:MAX_SENTENCE_CHARS]
    with httpx.Client(base_url=server, timeout=300) as client:
        client.post("/embed", json={"sentences": ["warm up ."]})
        before = _server_rss_mb(server)
        for _ in range(3):
            refused = client.post("/embed", json={"sentences": [long] * 64})
            assert refused.status_code == 400
            assert f"at most {MAX_EMBED_TOKENS:,}" in refused.json()["error"]
        fits = client.post("/embed", json={"sentences": [long] * 4})
        assert fits.status_code == 200 and len(fits.json()["sentences"]) == 4
        assert len(fits.content) < 64 << 20
        assert _server_rss_mb(server) - before < 300
