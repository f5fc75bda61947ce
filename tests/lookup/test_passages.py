"""Search by passage over pooled vectors (``elmo pool``) from the CLI, the Python API and a
real ``elmo serve`` process over HTTP, on examples/corpus embedded with the bundled model
(``serve_helpers.served_data``): the same hits everywhere, a corpus sentence finds itself
first, ``--where`` filters on document fields."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from serve_helpers import Served, running_server, served_data

import pipeline
from pipeline.lookup.pooled.store import pool_dataset

pytestmark = pytest.mark.slow  # the bundled model embeds the corpus and each query

QUERY = "Will you play upon this pipe ?"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Served:
    data = served_data(tmp_path_factory)
    for by in ("sentence", "document"):
        pool_dataset(str(data.dataset), by=by)  # the defaults; again: nothing new to pool
    return data


@pytest.fixture(scope="module")
def server(data: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("passages_log") / "server.log"
    with running_server(data, log=log) as url:
        yield url


def corpus_sentence(data: Served) -> dict:
    """A sentence of the corpus, long enough to be unique."""
    ds = pipeline.open_dataset(str(data.dataset))
    return ds.sql("SELECT doc_id, sent_idx, text FROM sentences WHERE n_tokens >= 12 "
                  "ORDER BY doc_id, sent_idx LIMIT 1").arrow().read_all().to_pylist()[0]


def test_python_finds_a_corpus_sentence_first(data: Served) -> None:
    wanted = corpus_sentence(data)
    hits = pipeline.open_index(str(data.index)).search_passages(wanted["text"], k=5)
    assert len(hits) == 5
    assert (hits[0].doc_id, hits[0].sent_idx) == (wanted["doc_id"], wanted["sent_idx"])
    assert hits[0].similarity > 0.999 and hits[0].text == wanted["text"]
    assert [h.similarity for h in hits] == sorted((h.similarity for h in hits), reverse=True)
    assert hits[0].fields["source"].endswith(".txt")
    table = pipeline.open_dataset(str(data.dataset)).pooled(by="sentence")
    assert table.num_rows == pipeline.open_dataset(str(data.dataset)).sql(
        "SELECT count(*) n FROM sentences").fetchall()[0][0]


def test_documents_and_where(data: Served) -> None:
    ix = pipeline.open_index(str(data.index))
    docs = ix.search_passages("The whale swam under the ship .", k=3, by="document")
    assert docs and all(h.sent_idx is None and h.text for h in docs)
    from pipeline.lookup.pooled.search import PassageSearch

    hits = PassageSearch(str(data.dataset)).search(QUERY, k=50, where=["source~moby"])
    assert hits and all("moby" in h.fields["source"] for h in hits)
    source = hits[0].fields["source"]
    same = ix.search_passages(QUERY, k=50, where={"source": source})
    assert [(h.doc_id, h.sent_idx) for h in same] == [(h.doc_id, h.sent_idx) for h in hits]


def cli_hits(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict]:
    from pipeline import cli

    capsys.readouterr()
    assert cli.main(argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_cli_server_and_python_agree(data: Served, server: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    python = [h.to_dict() for h in
              pipeline.open_index(str(data.index)).search_passages(QUERY, k=5)]
    by_dataset = cli_hits(["search", "passages", QUERY, "--dataset", str(data.dataset),
                           "-k", "5", "--format", "json"], capsys)
    by_index = cli_hits(["search", "passages", QUERY, "--index", str(data.index), "-k", "5",
                         "--format", "json"], capsys)
    with httpx.Client(base_url=server, timeout=60) as client:
        answer = client.post("/passages/search", json={"text": QUERY, "k": 5})
        assert answer.status_code == 200, answer.text
        served = answer.json()
        refused = client.post("/passages/search", json={"text": QUERY, "method": "median"})
        not_pooled = client.post("/passages/search", json={"text": QUERY, "mix": "layer:1"})
        too_many = client.post("/passages/search", json={"text": QUERY, "k": 10_000})
    assert served["rows"] > 0 and served["mix"] == "average"

    def keys(hits: list[dict]) -> list[tuple]:
        return [(h["doc_id"], h.get("sent_idx")) for h in hits]

    assert keys(python) == keys(by_dataset) == keys(by_index) == keys(served["hits"])
    for a, b in zip(python, served["hits"], strict=True):
        assert a["similarity"] == pytest.approx(b["similarity"], abs=1e-5)
        assert a["text"] == b["text"] and a["document"] == b["document"]
    assert refused.status_code == 400 and "median" in refused.json()["error"]
    assert not_pooled.status_code == 400 and "elmo pool" in not_pooled.json()["error"]
    assert too_many.status_code == 422
