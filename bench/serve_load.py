"""Load test of ``elmo serve``: concurrent clients, a fixed number of sense searches,
loopback only.

    .venv/bin/python bench/serve_load.py --dataset runs/demo/dataset --index runs/demo/index
    .venv/bin/python bench/serve_load.py --url http://127.0.0.1:8000 --clients 32 --requests 2000

Starts ``elmo serve`` on a free loopback port (or uses ``--url``, which must be loopback),
warms it up, then runs single-client (one request at a time) and ``--clients`` concurrent
clients (asyncio + httpx, one connection each), each sending ``POST /senses/search`` for
sentences drawn round-robin from a fixed list of (sentence, word) pairs (the server keeps
their layers after the first time; ``--fresh N`` adds runs whose sentences are all new,
so that every request runs the model). Reports p50/p99
latency, queries/s, the server's CPU time per request, its batching counters and its RSS
before and after (CPU and RSS from /proc, for a server this script started).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

REPO = Path(__file__).resolve().parent.parent
FRESH_RUN = f"run{os.getpid()}"  # new sentences of this run differ from any earlier run's
QUERIES = [
    ("He plays the guitar in a band", "plays"),
    ("They went to London to see the new play at the theatre .", "play"),
    ("She sat on the bank of the river", "bank"),
    ("The light of the moon fell on the water", "light"),
    ("It was a fair day and the wind was light", "fair"),
    ("The man went down to the sea in a ship", "man"),
    ("I shall speak to him of it", "speak"),
    ("He was a good and honest man", "good"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time the server has used (all its threads)."""
    if pid is None:
        return None
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "pipeline.cli", "serve", args.dataset, "--port", str(port)]
    for index in args.index:
        argv += ["--index", index]
    process = subprocess.Popen(argv, cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"elmo serve exited {process.returncode}")
        try:
            if httpx.get(f"{url}/info", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    sys.exit("elmo serve did not start in 180 s")


# What every request adds to its body (``--any-word``).
BODY_EXTRA: dict[str, object] = {}


async def client(url: str, jobs: asyncio.Queue[int], k: int, latencies: list[float],
                 fresh: bool) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        while True:
            try:
                n = jobs.get_nowait()
            except asyncio.QueueEmpty:
                return
            sentence, word = QUERIES[n % len(QUERIES)]
            if fresh:  # a sentence never seen: the model runs (no layer cache hit)
                sentence = f"{sentence} , {FRESH_RUN} {n} ."
            t0 = time.perf_counter()
            response = await http.post("/senses/search",
                                       json={"sentence": sentence, "word": word, "k": k,
                                             **BODY_EXTRA})
            latencies.append(time.perf_counter() - t0)
            if response.status_code != 200:
                raise SystemExit(f"{response.status_code}: {response.text[:200]}")


async def run(url: str, clients: int, requests: int, k: int, fresh: bool = False
              ) -> tuple[list[float], float]:
    jobs: asyncio.Queue[int] = asyncio.Queue()
    for n in range(requests):
        jobs.put_nowait(n)
    latencies: list[float] = []
    t0 = time.perf_counter()
    await asyncio.gather(*(client(url, jobs, k, latencies, fresh) for _ in range(clients)))
    return latencies, time.perf_counter() - t0


def measured(name: str, url: str, pid: int | None, clients: int, requests: int, k: int,
             fresh: bool = False) -> None:
    cpu0, mine0 = cpu_seconds(pid), time.process_time()
    latencies, seconds = asyncio.run(run(url, clients, requests, k, fresh))
    cpu1, mine1 = cpu_seconds(pid), time.process_time()
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    # Server CPU per request does not depend on what else the machine runs.
    cpu = "" if cpu0 is None or cpu1 is None else \
        f"; server CPU {(cpu1 - cpu0) / len(ms) * 1000:.2f} ms/request"
    print(f"{name:>12}: {len(ms)} requests in {seconds:.2f} s = {len(ms) / seconds:,.0f} q/s; "
          f"latency p50 {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms{cpu}; clients' CPU "
          f"{(mine1 - mine0) / len(ms) * 1000:.2f} ms/request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="runs/demo/dataset")
    parser.add_argument("--index", action="append", default=None)
    parser.add_argument("--url", help="a running loopback server instead of starting one")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=2000, help="concurrent run (2000)")
    parser.add_argument("--single", type=int, default=200, help="single-client run (200)")
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--fresh", type=int, default=0, metavar="N",
                        help="also N requests whose sentences are all new (the model runs)")
    parser.add_argument("--any-word", action="store_true",
                        help="search among every token, not the word's forms (the index's "
                        "in-memory IVF where it has one)")
    args = parser.parse_args()
    if args.any_word:
        BODY_EXTRA["any_word"] = True
    args.index = args.index or ["runs/demo/index"]
    process = None
    if args.url:
        if urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
            sys.exit("--url must be a loopback address: this is a load test")
        url = args.url
    else:
        process, url = start_server(args)
    pid = process.pid if process else None
    try:
        asyncio.run(run(url, 4, 64, args.k))  # warm-up: caches, allocator, code paths
        before = rss_mb(pid)
        stats0 = httpx.get(f"{url}/info").json()["batching"]
        measured("1 client", url, pid, 1, args.single, args.k)
        measured(f"{args.clients} clients", url, pid, args.clients, args.requests, args.k)
        if args.fresh:
            measured("1 client new", url, pid, 1, args.fresh // 4, args.k, fresh=True)
            measured(f"{args.clients} cl. new", url, pid, args.clients, args.fresh, args.k,
                     fresh=True)
        stats1 = httpx.get(f"{url}/info").json()["batching"]
        after = rss_mb(pid)
        jobs, batches = stats1["jobs"] - stats0["jobs"], stats1["batches"] - stats0["batches"]
        print(f"    batching: {jobs} requests in {batches} batches "
              f"({jobs / max(batches, 1):.1f} per batch, largest {stats1['largest']})")
        if before is not None and after is not None:
            print(f"  server RSS: {before:.0f} MB before, {after:.0f} MB after")
    finally:
        if process is not None:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
