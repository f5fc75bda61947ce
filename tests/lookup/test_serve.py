"""``elmo serve`` as a real process over HTTP: every route against the functions the CLI
verbs call, batching (concurrent answers equal one-at-a-time ones), the SQL guard, and
the token rule. The data: examples/corpus, the bundled model, a flat top-mix index."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from serve_helpers import (
    REPO,
    Served,
    elmo_serve_argv,
    free_port,
    running_server,
    serve_env,
    served_data,
)

from elmo_model.api import default_model_dir
from elmo_model.tokenizers import model_tokenizer

SQL_TIMEOUT_S = 1.5
QUERIES = [  # (sentence, word): words with many uses in examples/corpus, in several senses
    ("Will you play upon this pipe ?", "play"),
    ("They went to see the new play at the theatre .", "play"),
    ("The whale swam under the ship .", "whale"),
    ("I will speak to him tomorrow .", "speak"),
    ("The king sat upon his throne .", "king"),
    ("Come along , old hearty , come aboard .", "come"),
    ("He has a good heart and a kind word .", "good"),
    ("I know not what you mean .", "know"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Served:
    return served_data(tmp_path_factory)


@pytest.fixture(scope="module")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve_log") / "server.log"


@pytest.fixture(scope="module")
def server(data: Served, server_log: Path) -> Iterator[str]:
    with running_server(data, "--sql-timeout", str(SQL_TIMEOUT_S), log=server_log) as url:
        yield url


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as c:
        yield c


def search(client: httpx.Client, **body: object) -> dict:
    response = client.post("/senses/search", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def sql(client: httpx.Client, query: str, **params: object) -> httpx.Response:
    return client.post("/sql", json={"query": query, "params": params or None})


@pytest.mark.slow
def test_info_describes_the_dataset_and_index(client: httpx.Client, data: Served) -> None:
    info = client.get("/info").json()
    counts = sql(client, "SELECT (SELECT count(*) FROM documents), (SELECT count(*) FROM "
                         "sentences), (SELECT count(*) FROM tokens)").json()["rows"][0]
    assert info["dataset"]["rows"] == dict(zip(("documents", "sentences", "tokens"), counts,
                                               strict=True))
    assert info["dataset"]["layers"] == 3 and info["dataset"]["dim"] == 256
    assert info["dataset"]["tokenizer"]["name"] == model_tokenizer(str(default_model_dir()))
    assert {"source", "line"} <= set(info["dataset"]["document_fields"])
    [index] = info["indexes"]
    assert index["name"] == "index" and index["mix"] == "top" and index["rows"] == counts[2]
    assert 0 < index["words"] < counts[2]
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/info", "/embed", "/senses/search", "/senses/{word}", "/occurrences/{word}",
            "/sentences/{doc_id}/{sent_idx}", "/sql"} <= set(paths)


@pytest.mark.slow
def test_search_answers_as_the_cli_function_does(client: httpx.Client, data: Served) -> None:
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.senses.search import search_senses

    ix = SenseIndex(str(data.index))
    for sentence, word in QUERIES[:3]:
        for any_word in (False, True):
            got = search(client, sentence=sentence, word=word, k=7, any_word=any_word)
            want = search_senses(ix, sentence, word, k=7, match="any" if any_word else "forms")
            # The same contexts (a repeated passage's occurrences are one context: which
            # of them stands for it is not part of the answer).
            assert [(h["sentence"], h["tok_idx"]) for h in got["hits"]] == \
                [(h.sentence, h.tok_idx) for h in want]
            assert [h["similarity"] for h in got["hits"]] == pytest.approx(
                [h.similarity for h in want], abs=1e-4)
    first = search(client, sentence=QUERIES[0][0], word="play", k=3)
    assert first["query"] == {"tokens": ["Will", "you", "play", "upon", "this", "pipe", "?"],
                              "position": 2, "word": "play"}
    hit = first["hits"][0]
    # The corpus sentence itself comes first, the word located by its character offsets.
    assert hit["sentence"].endswith("Will you play upon this pipe?")
    assert hit["sentence"][hit["start"]:hit["end"]] == hit["token"] == "play"
    assert hit["similarity"] > 0.95 and hit["document"]["source"].endswith("/shakespeare_play.txt")


@pytest.mark.slow
def test_an_index_with_an_in_memory_ivf_answers_from_it(data: Served, tmp_path: Path) -> None:
    """An hnsw index also has the in-memory IVF: the server loads it at start, answers
    searches without a word from it as the CLI function does, and batched answers equal
    one-at-a-time ones."""
    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.index.ivf_search import IvfSearch
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.senses.search import search_senses

    graph = Served(data.dataset, tmp_path / "graph")
    build_index(str(data.dataset), "top", str(graph.index), kind="hnsw", compact=False)
    ix = SenseIndex(str(graph.index))
    assert ix.meta.ivf is not None
    assert isinstance(ix.vector_query(np.ones((1, ix.meta.dim), np.float32), k=5), IvfSearch)
    bodies = [{"sentence": s, "word": w, "k": 6, "any_word": True} for s, w in QUERIES]
    with running_server(graph, log=tmp_path / "server.log") as url, \
            httpx.Client(base_url=url, timeout=60) as graph_client:
        [info] = graph_client.get("/info").json()["indexes"]
        assert info["vector_index"] == "hnsw" and info["in_memory_ivf"] == ix.meta.ivf
        alone = [search(graph_client, **body)["hits"] for body in bodies]
        for (sentence, word), got in zip(QUERIES, alone, strict=True):
            want = search_senses(ix, sentence, word, k=6, match="any")
            assert [(h["sentence"], h["tok_idx"]) for h in got] == \
                [(h.sentence, h.tok_idx) for h in want]
            assert [h["similarity"] for h in got] == pytest.approx(
                [h.similarity for h in want], abs=1e-4)
        with ThreadPoolExecutor(len(bodies)) as pool:
            together = list(pool.map(lambda body: search(graph_client, **body)["hits"],
                                     bodies))
        assert together == alone


@pytest.mark.slow
def test_concurrent_requests_are_batched_and_answer_as_one_at_a_time(
        client: httpx.Client) -> None:
    bodies = [{"sentence": s, "word": w, "k": k, "any_word": any_word}
              for s, w in QUERIES for k, any_word in ((5, False), (12, False), (5, True))]
    alone = [search(client, **body)["hits"] for body in bodies]
    before = client.get("/info").json()["batching"]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda body: search(client, **body)["hits"], bodies * 2))
    after = client.get("/info").json()["batching"]
    for got, want in zip(together, alone * 2, strict=True):
        assert [(h["sentence"], h["tok_idx"]) for h in got] == \
            [(h["sentence"], h["tok_idx"]) for h in want]
        assert [h["similarity"] for h in got] == pytest.approx(
            [h["similarity"] for h in want], abs=1e-4)
    jobs, batches = after["jobs"] - before["jobs"], after["batches"] - before["batches"]
    assert jobs == 2 * len(bodies)
    assert batches < jobs and after["largest"] > 1  # requests shared model calls


@pytest.mark.slow
def test_filters_keep_hits_of_matching_documents(client: httpx.Client) -> None:
    body = {"sentence": QUERIES[0][0], "word": "play", "k": 5}
    everywhere = search(client, **body)["hits"]
    assert {Path(h["document"]["source"]).name for h in everywhere} == {"shakespeare_play.txt"}
    hits = search(client, **body, where=["source~moby_dick_play"])["hits"]
    assert hits and all(h["document"]["source"].endswith("/moby_dick_play.txt") for h in hits)
    # The same filter as a mapping (equal to the stored source URI) finds the same uses.
    same = search(client, **body, filters={"source": hits[0]["document"]["source"]})["hits"]
    assert [h["doc_id"] for h in same] == [h["doc_id"] for h in hits]
    bad = client.post("/senses/search", json={**body, "where": ["year"]})
    assert bad.status_code == 400 and bad.json()["error"].startswith("where 'year': write ")
    unknown = client.post("/senses/search", json={**body, "filters": {"colour": "red"}})
    assert unknown.status_code == 400 and "colour" in unknown.json()["error"]


@pytest.mark.slow
def test_embed_returns_tokens_and_every_layer_or_a_mix(client: httpx.Client) -> None:
    sentences = ["He plays the guitar in a band.", "The whale !"]
    layers = client.post("/embed", json={"sentences": sentences, "mix": None}).json()
    top = client.post("/embed", json={"sentences": sentences, "mix": "top"}).json()
    assert [s["tokens"] for s in layers["sentences"]] == [
        ["He", "plays", "the", "guitar", "in", "a", "band", "."], ["The", "whale", "!"]]
    for all_layers, mixed in zip(layers["sentences"], top["sentences"], strict=True):
        array = np.array(all_layers["vectors"])
        assert array.shape == (3, len(all_layers["tokens"]), 256)
        np.testing.assert_allclose(np.array(mixed["vectors"]), array[2], atol=1e-5)
    bad = client.post("/embed", json={"sentences": sentences, "mix": "nope"})
    assert bad.status_code == 400 and "nope" in bad.json()["error"]


@pytest.mark.slow
def test_sense_clusters_and_map_points(client: httpx.Client) -> None:
    result = client.get("/senses/play", params={"k": "auto"}).json()
    assert result["auto"] and 2 <= result["k"] <= 8 and len(result["clusters"]) == result["k"]
    assert sum(c["size"] for c in result["clusters"]) == len(result["points"]) \
        == result["distinct"]
    assert {p["cluster"] for p in result["points"]} == set(range(result["k"]))
    assert all(c["examples"] and c["name"].startswith(f"sense {c['label'] + 1} ")
               for c in result["clusters"])
    three = client.get("/senses/play", params={"k": 3}).json()
    assert three["k"] == 3 and not three["auto"]
    assert client.get("/senses/zzzzqx").status_code == 400  # no contexts to cluster


@pytest.mark.slow
def test_occurrences_page_through_every_use(client: httpx.Client) -> None:
    n = sql(client, "SELECT count(*) FROM tokens WHERE lower(token) = $w",
            w="play").json()["rows"][0][0]
    first = client.get("/occurrences/play", params={"limit": 10}).json()
    assert first["total"] == n and len(first["occurrences"]) == 10
    rest = client.get("/occurrences/play", params={"limit": 1000, "offset": 10}).json()
    keys = {(h["doc_id"], h["sent_idx"], h["tok_idx"])
            for h in first["occurrences"] + rest["occurrences"]}
    assert len(keys) == n
    assert all(h["token"].lower() == "play" for h in rest["occurrences"])


@pytest.mark.slow
def test_sentence_in_context(client: httpx.Client) -> None:
    hit = search(client, sentence=QUERIES[0][0], word="play", k=1)["hits"][0]
    got = client.get(f"/sentences/{hit['doc_id']}/{hit['sent_idx']}",
                     params={"context": 2}).json()
    want = sql(client, "SELECT sent_idx, text FROM sentences WHERE doc_id = $d AND sent_idx "
                       "BETWEEN $s - 2 AND $s + 2 ORDER BY sent_idx",
               d=hit["doc_id"], s=hit["sent_idx"]).json()["rows"]
    assert [[s["sent_idx"], s["text"]] for s in got["sentences"]] == want
    assert hit["sentence"] in [s["text"] for s in got["sentences"]]
    assert client.get("/sentences/no-such-doc/0").status_code == 404


@pytest.mark.slow
def test_sql_reads_and_refuses_everything_else(client: httpx.Client, tmp_path: Path) -> None:
    ok = sql(client, "SELECT lower(token) AS w, count(*) AS n FROM tokens WHERE lower(token) "
                     "= $w GROUP BY 1", w="whale").json()
    assert ok["columns"] == ["w", "n"] and ok["rows"][0][0] == "whale"
    target = tmp_path / "out.csv"
    hostile = [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM glob('/*')",
        f"COPY (SELECT 1) TO '{target}'",
        f"ATTACH '{tmp_path / 'x.db'}' AS x",
        "INSTALL httpfs", "LOAD httpfs", "SET threads = 8", "PRAGMA database_list",
        "SET enable_external_access = true", "RESET lock_configuration",
        "CREATE TABLE t AS SELECT 1", "DROP VIEW tokens", "SELECT 1; SELECT 2",
        "DETACH memory", "CALL duckdb_settings()", "EXPORT DATABASE '/tmp/x'",
        "SELECT * FROM 'https://example.com/x.parquet'",
    ]
    for query in hostile:
        response = sql(client, query)
        assert response.status_code == 400, (query, response.text)
        message = response.json()["error"]
        assert "\n" not in message and "Traceback" not in message
    assert not target.exists()
    assert sql(client, "SELECT count(*) FROM tokens").status_code == 200  # views intact
    slow = sql(client, "SELECT count(*) FROM range(1000000000) a, range(10) b "
                       "WHERE a.range + b.range < 0")
    assert slow.status_code == 400 and "longer than" in slow.json()["error"]
    # A cross product that would hold a billion rows meets the memory limit first.
    big = sql(client, "SELECT count(*) FROM range(1000000000) a, range(1000000000) b")
    assert big.status_code == 400 and "--sql-memory" in big.json()["error"]
    many = sql(client, "SELECT * FROM range(50000)").json()
    assert many["truncated"] and len(many["rows"]) == 10_000


def test_sql_calls_print_no_warning(client: httpx.Client, server_log: Path) -> None:
    # DuckDB warned on every call that Arrow output from a DB-API result copies the rows.
    for _ in range(3):
        assert sql(client, "SELECT token FROM tokens LIMIT 5").status_code == 200
    assert sql(client, "EXPLAIN SELECT count(*) FROM tokens").status_code == 200
    text = server_log.read_text()
    assert "extra copy" not in text and "sql_guard" not in text, text[-2000:]


@pytest.mark.slow
def test_other_hosts_need_a_token(data: Served, tmp_path: Path) -> None:
    refused = subprocess.run(elmo_serve_argv(data, free_port(), "--host", "0.0.0.0"),
                             cwd=REPO, env=serve_env(), capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "elmo: error: --host 0.0.0.0 lets other machines in: give --token TOKEN (or set "
        "ELMO_SERVE_TOKEN), or keep the default 127.0.0.1"]
    token = {"Authorization": "Bearer s3cret-token"}
    with running_server(data, "--host", "0.0.0.0", "--token", "s3cret-token",
                        log=tmp_path / "server.log", headers=token) as url:
        for path in ("/info", "/", "/openapi.json", "/occurrences/play"):
            response = httpx.get(url + path)
            assert response.status_code == 401 and "Bearer" in response.json()["error"]
            wrong = httpx.get(url + path, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            assert httpx.get(url + path, headers=token).status_code == 200
        posted = httpx.post(url + "/sql", json={"query": "SELECT 1"})
        assert posted.status_code == 401
        assert json.loads(httpx.post(url + "/sql", json={"query": "SELECT 1"}, headers=token
                                     ).text)["rows"] == [[1]]


@pytest.mark.slow
def test_unknown_dataset_or_index_is_one_line(data: Served, tmp_path: Path) -> None:
    cases = [([str(tmp_path / "nope"), "--index", str(data.index)], "no _dataset.json"),
             ([str(data.dataset), "--index", str(tmp_path / "nope.lance")],
              "is not an elmo sense index"),
             ([str(data.dataset), "--index", f"a={data.index}", "--index", f"a={data.index}"],
              "two indexes are named 'a'")]
    for argv, says in cases:
        done = subprocess.run([*elmo_serve_argv(data, free_port())[:4], *argv], cwd=REPO,
                              env=serve_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 2
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("elmo: error: ") and says in line
