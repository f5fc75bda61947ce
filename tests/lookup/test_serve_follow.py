"""A server that follows its index (``pipeline/lookup/serve/follow.py``): `elmo index build
--rebuild` (and a plain build after it) run on the index a loaded `elmo serve` process
holds; no request fails while they run, and once the build commits the server answers
from the new index without a restart."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from serve_helpers import REPO, Served, running_server, serve_env, served_data

from pipeline.lookup.index.sense_index import SenseIndex

REQUESTS = [  # what the issue saw fail: filters, occurrences, any-word searches
    ("post", "/senses/search", {"sentence": "Will you play upon this pipe ?", "word": "play",
                                "k": 5, "where": ["source~moby_dick_play"]}),
    ("get", "/occurrences/play", {"limit": 20}),
    ("post", "/senses/search", {"sentence": "The whale swam under the ship .",
                                "word": "whale", "k": 5, "any_word": True}),
    ("post", "/senses/search", {"sentence": "Come along , old hearty , come aboard .",
                                "word": "come", "k": 5}),
]


class Load:
    """Clients sending ``REQUESTS`` round after round until stopped: every status seen."""

    def __init__(self, url: str, clients: int = 3) -> None:
        self.url, self.statuses, self.failures = url, Counter(), []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(clients)]

    def _run(self, first: int) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            turn = first
            while not self._stop.is_set():
                method, path, body = REQUESTS[turn % len(REQUESTS)]
                turn += 1
                try:
                    response = client.post(path, json=body) if method == "post" \
                        else client.get(path, params=body)
                except httpx.HTTPError as error:  # the server went away
                    if not self._stop.is_set():
                        self.failures.append((path, 0, repr(error)))
                    return
                self.statuses[response.status_code] += 1
                if response.status_code != 200:
                    self.failures.append((path, response.status_code, response.text[:300]))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=180)


def build(data: Served, *extra: str) -> None:
    run = subprocess.run([sys.executable, "-m", "pipeline.cli", "index", "build",
                          str(data.dataset), "--out", str(data.index), "--no-progress",
                          *extra], cwd=REPO, env=serve_env(), capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr


def served_rows(url: str) -> int:
    return httpx.get(f"{url}/info", timeout=120).json()["indexes"][0]["rows"]


@pytest.mark.slow
def test_a_rebuild_under_a_loaded_server_fails_no_request_and_is_picked_up(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    shared = served_data(tmp_path_factory)
    data = Served(shared.dataset, tmp_path / "index")
    shutil.copytree(shared.index, data.index)  # the session's index stays as it is
    log = tmp_path / "server.log"
    with running_server(data, log=log) as url:
        before = served_rows(url)
        with Load(url) as load:
            time.sleep(2)  # the load is on before the build starts
            # Another selection of words: fewer rows, so the new index shows in /info.
            build(data, "--rebuild", "--full", "--index", "flat", "--min-count", "2")
            rows = SenseIndex(str(data.index)).meta.rows
            assert rows < before
            deadline = time.monotonic() + 120
            while served_rows(url) != rows and time.monotonic() < deadline:
                time.sleep(0.2)
            assert served_rows(url) == rows, log.read_text()[-2000:]
            during = sum(load.statuses.values())
            # A plain build now (nothing to add): it commits again, answered the same.
            build(data)
            time.sleep(2)
        assert not load.failures, load.failures[:5]
        assert sum(load.statuses.values()) > during > 0
        occurrences = httpx.get(f"{url}/occurrences/play", params={"limit": 1}).json()
        assert occurrences["total"] == SenseIndex(str(data.index)).word_rows(["play"])
    assert "now answering from its new build" in log.read_text()
