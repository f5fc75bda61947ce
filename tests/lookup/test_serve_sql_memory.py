"""/sql cannot take ``elmo serve`` down (issue 50). A size computed inside a query grew the
server past any limit: DuckDB's memory_limit does not cover a vector of huge strings or
lists, and one ``repeat()`` query took a server from 0.44 to 2.9 GB (18 GB in a probe).
The server now runs /sql in a worker process capped at its idle size plus
``--sql-memory`` (``pipeline/lookup/serve/sql_worker.py``). Each test talks HTTP to a
real ``elmo serve`` process and watches the memory of it and of its worker."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from helpers import REPO
from serve_helpers import (
    Served,
    child_pids,
    elmo_serve_argv,
    free_port,
    memory_mb,
    running_server,
    serve_env,
    served_data,
    server_pid,
)

from pipeline.lookup.serve.limits import SQL_MAX_RESPONSE_BYTES

SQL_MEMORY_MB = 384
TIMEOUT_S = 3
COUNT = {"query": "SELECT count(*) AS n, count(DISTINCT lower(token)) AS words FROM tokens"}
# Each passes the literal-size check (sql_guard.SIZED_FUNCTIONS): its size is under
# 1,000,000 or computed in the query, and each needs far more than SQL_MEMORY_MB.
HOSTILE = [
    "SELECT repeat('x', 1000000) AS s FROM range(10000)",
    "SELECT repeat('x', (SELECT 900000 + count(*) FROM tokens)::INT) AS s FROM range(10000)",
    "SELECT string_agg(repeat('x', 100000), ',') FROM range(100000)",
    "SELECT list(range) FROM range(200000000)",
    "SELECT list(s) FROM (SELECT repeat('y', 999999) s FROM range(3000))",
    "SELECT max(length(repeat(repeat('x', 1000000), 1000))) FROM range(10)",
    "SELECT count(*) FROM range(1000000000) a, range(1000000000) b",
]
# Interrupted by its time limit, not by memory.
SLOW = "SELECT count(*) FROM range(1000000000) a, range(10) b WHERE a.range + b.range < 0"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = served_data(tmp_path_factory)
    log = tmp_path_factory.mktemp("serve_sql_memory") / "server.log"
    with running_server(data, "--sql-memory", str(SQL_MEMORY_MB), "--sql-timeout",
                        str(TIMEOUT_S), log=log) as url:
        yield url
        assert "Traceback" not in log.read_text()


@dataclass
class Peaks:
    server: float = 0.0  # the server process's largest resident size seen, MB
    workers: dict[int, float] = field(default_factory=dict)  # each worker's VmHWM, MB


@contextmanager
def watched(pid: int) -> Iterator[Peaks]:
    """The server's and its workers' peak memory while the block runs (sampled every
    10 ms; a worker's own peak, VmHWM, misses nothing between samples)."""
    peaks, done = Peaks(), threading.Event()

    def sample() -> None:
        while not done.is_set():
            peaks.server = max(peaks.server, memory_mb(pid))
            for child in child_pids(pid):
                peak = memory_mb(child, "VmHWM")
                peaks.workers[child] = max(peaks.workers.get(child, 0.0), peak)
            time.sleep(0.01)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        done.set()
        thread.join()


def one_line_error(response: httpx.Response) -> str:
    body = response.json()
    assert list(body) == ["error"], body
    message = body["error"]
    assert message and "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.slow
def test_hostile_sql_gets_one_line_and_the_server_stays_within_its_bound(server: str
                                                                          ) -> None:
    with httpx.Client(base_url=server, timeout=120) as client:
        count = client.post("/sql", json=COUNT).json()
        assert count["rows"][0][0] > 0
        pid = server_pid(server)
        [worker] = child_pids(pid)
        idle_server, idle_worker = memory_mb(pid), memory_mb(worker)
        with watched(pid) as peaks:
            for query in HOSTILE:
                response = client.post("/sql", json={"query": query})
                assert response.status_code == 400, (query, response.text[:300])
                message = one_line_error(response)
                assert f"{SQL_MEMORY_MB:,} MB" in message and "--sql-memory" in message, \
                    (query, message)
                # Right after, a normal query answers, and the same as before.
                assert client.post("/sql", json=COUNT).json() == count
        assert client.get("/info").status_code == 200
    print(f"server {idle_server:.0f} -> peak {peaks.server:.0f} MB; worker {idle_worker:.0f}"
          f" MB idle, peaks {sorted(round(p) for p in peaks.workers.values())}")
    assert peaks.server < idle_server + 64  # the server itself never holds a query's data
    assert max(peaks.workers.values()) < idle_worker + SQL_MEMORY_MB + 64
    assert len(peaks.workers) > 1  # a worker that breached its cap was replaced
    assert not (REPO / ".tmp").exists()  # DuckDB's spill folder, in the server's directory


@pytest.mark.slow
def test_a_worker_that_dies_or_hangs_is_replaced(server: str) -> None:
    """A worker killed mid-query (the kernel's OOM killer, a crash) costs that request a
    503; one that stops answering past its time limit is killed; the next query answers."""
    with httpx.Client(base_url=server, timeout=120) as client, \
            ThreadPoolExecutor(1) as pool:
        count = client.post("/sql", json=COUNT).json()  # the worker is warm
        pid = server_pid(server)
        for stop, status, words in ((signal.SIGKILL, 503, ("SIGKILL", "--sql-memory")),
                                    (signal.SIGSTOP, 400, (f"longer than {TIMEOUT_S} s",))):
            [worker] = child_pids(pid)
            pending = pool.submit(client.post, "/sql", json={"query": SLOW})
            time.sleep(1.0)  # the query is running
            os.kill(worker, stop)
            response = pending.result()
            assert response.status_code == status, response.text
            message = one_line_error(response)
            assert all(word in message for word in words), message
            assert worker not in child_pids(pid)  # killed and reaped
            assert client.post("/sql", json=COUNT).json() == count


@pytest.mark.slow
def test_an_answer_over_the_json_bound_is_refused(server: str) -> None:
    """Under the Arrow bound (12 MB of control characters) but over the JSON one (each
    written as 6 characters): refused by the worker, which alone held it."""
    query = {"query": "SELECT repeat(chr(1), 3000) AS s FROM range(4000)"}
    with httpx.Client(base_url=server, timeout=120) as client:
        response = client.post("/sql", json=query)
        assert response.status_code == 400, response.text[:300]
        assert f"over {SQL_MAX_RESPONSE_BYTES >> 20} MB of JSON" in one_line_error(response)
        fits = client.post("/sql", json={"query": "SELECT repeat(chr(1), 3000) AS s FROM "
                                                  "range(100)"})
        assert fits.status_code == 200 and fits.json()["rows"][0][0] == "\x01" * 3000


def test_a_small_sql_memory_is_refused_in_one_line(tmp_path: Path) -> None:
    nowhere = Served(tmp_path / "no-dataset", tmp_path / "no-index")  # checked first
    refused = subprocess.run([*elmo_serve_argv(nowhere, free_port()), "--sql-memory", "64"],
                             cwd=REPO, env=serve_env(), capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "elmo: error: --sql-memory must be at least 128 (MB), not 64"]
