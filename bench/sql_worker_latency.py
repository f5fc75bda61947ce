"""A small ``/sql`` request to two ``elmo serve`` processes side by side: one from another
source tree (e.g. before /sql moved into its worker process) and one from this tree.

    git archive baf619c | tar -x -C /tmp/old
    .venv/bin/python bench/sql_worker_latency.py --old-tree /tmp/old --dataset DS --index IX

Both servers serve the same dataset and index; the requests alternate between them one by
one (so load on the machine falls on both alike), each over a kept-alive HTTP connection.
Prints per query: the median and p95 wall time of each server, the ratio of the medians,
and each server's resident memory (the server and its children, VmRSS) when idle.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
QUERIES = {
    "count": "SELECT count(*) AS n FROM tokens",
    "word": "SELECT doc_id, sent_idx, tok_idx FROM tokens WHERE lower(token) = 'the' "
            "ORDER BY ALL LIMIT 20",
    "one": "SELECT 1 AS x",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(tree: Path, dataset: str, index: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", dataset,
                                    "--index", index, "--port", str(port)], cwd=tree,
                                   env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{tree}: the server exited: {log.read_text()[-1000:]}")
        try:
            if httpx.get(url + "/info", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{tree}: the server did not answer")


def tree_rss_mb(pid: int) -> float:
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    total = 0.0
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(status.split("VmRSS:")[1].split()[0]) / 1024
        except (OSError, IndexError):
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old-tree", required=True, type=Path)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--index", required=True)
    parser.add_argument("--requests", type=int, default=500, help="per query and server")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    trees = {"old": args.old_tree.resolve(), "new": REPO}
    servers = {name: start(tree, args.dataset, args.index, args.log_dir / f"sql_{name}.log")
               for name, tree in trees.items()}
    try:
        clients = {name: httpx.Client(base_url=url, timeout=60)
                   for name, (_, url) in servers.items()}
        for client in clients.values():  # warm: first queries open files and caches
            for query in QUERIES.values():
                for _ in range(5):
                    client.post("/sql", json={"query": query}).raise_for_status()
        print({name: f"{tree_rss_mb(p.pid):.0f} MB idle" for name, (p, _) in servers.items()})
        for label, query in QUERIES.items():
            times: dict[str, list[float]] = {name: [] for name in servers}
            answers = {}
            for _ in range(args.requests):
                for name, client in clients.items():
                    t = time.perf_counter()
                    response = client.post("/sql", json={"query": query})
                    times[name].append(time.perf_counter() - t)
                    answers[name] = response.content
            assert answers["old"] == answers["new"], label  # the same bytes
            med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
            p95 = {n: sorted(v)[int(0.95 * len(v))] * 1e3 for n, v in times.items()}
            print(f"{label:6s} old p50 {med['old']:.2f} ms p95 {p95['old']:.2f} | new p50 "
                  f"{med['new']:.2f} ms p95 {p95['new']:.2f} | "
                  f"new/old {med['new'] / med['old']:.2f}")
        print({name: f"{tree_rss_mb(p.pid):.0f} MB after" for name, (p, _) in servers.items()})
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    main()
