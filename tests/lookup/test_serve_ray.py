"""``elmo serve --ray-address local --replicas 2``: the same app on Ray Serve, on a local
Ray started by the command, answers as the single-process server does, from two
replica processes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serve_helpers import Served, running_server, served_data

SEARCH = {"sentence": "Will you play upon this pipe ?", "word": "play", "k": 5}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Served:
    return served_data(tmp_path_factory)


@pytest.fixture(scope="module")
def ray_server(data: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve_ray") / "server.log"
    with running_server(data, "--ray-address", "local", "--replicas", "2", log=log) as url:
        yield url


@pytest.mark.slow
def test_ray_serve_replicas_answer_as_the_plain_server(ray_server: str, data: Served,
                                                       tmp_path: Path) -> None:
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.senses.search import search_senses

    with httpx.Client(base_url=ray_server, timeout=60) as client:
        # Both replicas take requests. The server answers once one replica is up; on a
        # loaded machine the second may start seconds later, so ask until both have answered.
        processes: set[int] = set()
        deadline = time.monotonic() + 90
        while len(processes) < 2 and time.monotonic() < deadline:
            processes.add(client.get("/info").json()["process"])
        assert len(processes) == 2
        hits = client.post("/senses/search", json=SEARCH).json()["hits"]
        want = search_senses(SenseIndex(str(data.index)), SEARCH["sentence"], "play", k=5)
        assert [(h["sentence"], h["tok_idx"]) for h in hits] == \
            [(h.sentence, h.tok_idx) for h in want]
        refused = client.post("/sql", json={"query": "COPY tokens TO '/tmp/x.csv'"})
        assert refused.status_code == 400 and "only SELECT" in refused.json()["error"]
        page = client.get("/")
        assert page.status_code == 200 and "/static/plotly.min.js" in page.text
