"""A few hundred malformed and hostile requests at a real ``elmo serve`` process: each
gets a 4xx whose body is ``{"error": "<one line>"}`` (never a 500, never a traceback),
and the server keeps answering."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serve_helpers import Served, running_server, served_data

from pipeline.lookup.serve.limits import MAX_BODY_BYTES, MAX_K, MAX_SENTENCES

GOOD_SEARCH = {"sentence": "Will you play upon this pipe ?", "word": "play"}
ODD_VALUES = [None, True, -1, 0, 10**30, 1.5, -0.0, "", " ", "\x00", "é" * 300,
              [], {}, [1, 2], {"a": 1}, "' OR 1=1 --", "<script>alert(1)</script>",
              "../../etc/passwd", "%00", "\u202e", "\U0001f600" * 5]


def search_bodies() -> list[object]:
    """Each is wrong: a 4xx is the only right answer."""
    return [
        {}, [], "text", 42, None, {"sentence": "x"}, {"word": "play"},
        {**GOOD_SEARCH, "sentence": ""}, {**GOOD_SEARCH, "sentence": "   "},
        {**GOOD_SEARCH, "word": "guitar"}, {**GOOD_SEARCH, "word": ""},
        {**GOOD_SEARCH, "k": 0}, {**GOOD_SEARCH, "k": MAX_K + 1}, {**GOOD_SEARCH, "k": -5},
        {**GOOD_SEARCH, "k": "ten"}, {**GOOD_SEARCH, "occurrence": 0},
        {**GOOD_SEARCH, "occurrence": 2}, {**GOOD_SEARCH, "index": "nope"},
        {**GOOD_SEARCH, "filters": {"nope": "x"}}, {**GOOD_SEARCH, "filters": "source=a"},
        {**GOOD_SEARCH, "filters": {"source": [{"a": 1}]}}, {**GOOD_SEARCH, "extra": 1},
        {**GOOD_SEARCH, "where": "year>=1900"}, {**GOOD_SEARCH, "where": ["year"]},
        {**GOOD_SEARCH, "any_word": "maybe"}, {**GOOD_SEARCH, "sentence": "x" * 3000},
        {**GOOD_SEARCH, "sentence": "...", "word": "play"},
        {**GOOD_SEARCH, "filters": {f"f{i}": "x" for i in range(40)}},
    ]


def odd_search_bodies() -> list[object]:
    """Each field set to odd values: some are fine (``k: 1.5`` is not, ``filters: {}``
    is), so any answer but a 5xx is right, and a refusal must still be one line."""
    return [{**GOOD_SEARCH, field: value} for value in ODD_VALUES
            for field in ("sentence", "word", "k", "occurrence", "any_word", "filters", "index")]


def embed_bodies() -> list[object]:
    return [{}, {"sentences": []}, {"sentences": [""]}, {"sentences": "one"},
            {"sentences": [1, 2]}, {"sentences": [None]}, {"sentences": ["ok"], "mix": 3},
            {"sentences": ["ok"], "mix": "no-such-mix"}, {"sentences": ["ok"], "mix": "{"},
            {"sentences": ["ok"], "mix": '{"weights": [1]}'},
            {"sentences": ["ok"], "mix": "layer:99"},
            {"sentences": ["a"] * (MAX_SENTENCES + 1)}, {"sentences": ["..."], "x": 1},
            {"sentences": ["\x00\x01"]}]


def sql_bodies() -> list[object]:
    queries = ["", " ", "SELEC 1", "SELECT * FROM nowhere", "SELECT $missing",
               "SELECT * FROM read_csv('/etc/passwd')", "COPY tokens TO '/tmp/elmo-x.csv'",
               "ATTACH ':memory:' AS m", "INSTALL httpfs", "LOAD json", "SET memory_limit='1GB'",
               "PRAGMA show_tables", "CHECKPOINT", "VACUUM", "DELETE FROM tokens",
               "INSERT INTO tokens VALUES (1)", "UPDATE tokens SET token = 'x'",
               "CREATE MACRO m() AS 1", "SELECT 1; DROP VIEW tokens", "USE memory",
               "SELECT read_blob('/etc/shadow')", "SELECT getenv('HOME')",
               "SELECT * FROM duckdb_secrets()", "SELECT elmo_mix(1, 2)",
               "SELECT 'x' * 3", "SELECT error('boom')", "SELECT CAST('x' AS INTEGER)",
               "SELECT repeat('x', 100000000)"]
    return [{"query": q} for q in queries] + [
        {}, {"query": 1}, {"query": ["SELECT 1"]}, {"query": "SELECT 1", "params": "x"},
        {"query": "SELECT $a", "params": {"a": [1]}}, {"query": "x" * 30_000}]


def requests_to_send() -> list[tuple[str, str, dict]]:
    """``(method, path, httpx keyword arguments)``, each wrong."""
    out: list[tuple[str, str, dict]] = []
    for body in search_bodies():
        out.append(("POST", "/senses/search", {"json": body}))
    for body in embed_bodies():
        out.append(("POST", "/embed", {"json": body}))
    for body in sql_bodies():
        out.append(("POST", "/sql", {"json": body}))
    raw = ["{", "{bad json}", "nul", '{"sentence": "a", }', "\xff\xfe", "[" * 5000 + "]" * 5000,
           '{"sentence": "' + "a" * 100 + '"', json.dumps(GOOD_SEARCH)[:-1],
           '{"sentence": "a b", "word": "a", "k": NaN}', '{"sentences": ["a"], "mix": Infinity}',
           '{"sentence": "\\ud800 x", "word": "x"}', '{"sentences": ["\\udfff"]}']
    for path in ("/senses/search", "/embed", "/sql"):
        for text in raw:
            out.append(("POST", path, {"content": text.encode("utf-8", "surrogatepass"),
                                       "headers": {"content-type": "application/json"}}))
        out.append(("POST", path, {"content": b"x" * (MAX_BODY_BYTES + 1),
                                   "headers": {"content-type": "application/json"}}))
        out.append(("POST", path, {"content": b"sentence=a",
                                   "headers": {"content-type": "text/plain"}}))
        out.append(("GET", path, {}))
    gets = ["/senses/play?k=0", "/senses/play?k=99", "/senses/play?k=abc",
            "/senses/play?index=nope", "/senses/" + "w" * 500, "/senses/zzqxj",
            "/senses/%00", "/occurrences/play?limit=0", "/occurrences/play?limit=100000",
            "/occurrences/play?offset=-1", "/occurrences/play?limit=x",
            "/occurrences/play?index=nope", "/occurrences/" + "w" * 500,
            "/sentences/x/-1", "/sentences/x/abc", "/sentences/no-doc/0",
            "/sentences/shakespeare_play.txt:1/0?context=-1",
            "/sentences/shakespeare_play.txt:1/0?context=1000",
            "/sentences/..%2F..%2Fetc%2Fpasswd/0", "/static/../../../etc/passwd",
            "/static/%2e%2e/%2e%2e/etc/passwd", "/nope", "/info/extra", "/sql",
            "/sentences/x/99999999999999999999999"]
    out += [("GET", path, {}) for path in gets]
    for method in ("PUT", "DELETE", "PATCH"):
        out += [(method, path, {}) for path in ("/info", "/sql", "/senses/search")]
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data: Served = served_data(tmp_path_factory)
    log = tmp_path_factory.mktemp("serve_hostile") / "server.log"
    with running_server(data, "--sql-timeout", "2", log=log) as url:
        yield url
        assert "Traceback" not in Path(log).read_text()


@pytest.mark.slow
def test_hostile_requests_get_one_line_4xx_and_the_server_stays_up(server: str) -> None:
    cases = [(*case, False) for case in requests_to_send()]
    cases += [("POST", "/senses/search", {"json": body}, True) for body in odd_search_bodies()]
    cases += [("POST", "/embed", {"json": body}, True)
              for value in ODD_VALUES for body in ({"sentences": [value]},
                                                   {"sentences": ["A b ."], "mix": value})]
    random.Random(0).shuffle(cases)
    assert len(cases) >= 300
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=server, timeout=60) as client:
        for method, path, kwargs, may_succeed in cases:
            response = client.request(method, path, **kwargs)
            where = f"{method} {path} {str(kwargs)[:200]}"
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if may_succeed and response.status_code == 200:
                continue
            assert 400 <= response.status_code < 500, (where, response.text[:300])
            body = response.json()
            assert list(body) == ["error"], where
            message = body["error"]
            assert isinstance(message, str) and message and "\n" not in message, where
            assert "Traceback" not in message and 'File "' not in message, where
        assert client.get("/info").status_code == 200
        ok = client.post("/senses/search", json=GOOD_SEARCH)
        assert ok.status_code == 200 and ok.json()["hits"]
    assert {400, 404, 405, 413, 422} <= set(statuses)
