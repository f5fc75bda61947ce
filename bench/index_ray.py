"""A compact index searched by Ray actors (``elmo senses search --ray-address``) beside one
process: the same hits, p50 per search, and each process's memory.

    .venv/bin/python bench/index_ray.py --rows 200000 --dim 256 --work /tmp/ray-bench

Writes a synthetic dataset (``bench/lookup.py``) of ``--shards`` files, builds its compact
index, then times ``--queries`` searches (stored rows plus noise, keys only, k=10) in this
process and on ``--actors`` actors of a local Ray, and compares the hits.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
KEYS = ["part", "shard", "row"]


def rss_gb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    return kb / 2**20


def timed(index, queries: np.ndarray) -> tuple[list[list[tuple]], float]:
    hits, took = [], []
    for q in queries:
        t0 = time.perf_counter()
        found = index.search(q, k=10, columns=KEYS)
        took.append(time.perf_counter() - t0)
        hits.append(list(zip(*(found[c].to_pylist() for c in KEYS), strict=True)))
    return hits, statistics.median(took) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.index.ivf_ray import scatter
    from pipeline.lookup.index.sense_index import SenseIndex

    work = Path(args.work)
    if not (work / "ix" / "_elmo_index.json").exists():
        spec = importlib.util.spec_from_file_location("bench_lookup", REPO / "bench/lookup.py")
        lookup = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(lookup)
        lookup.write_synthetic(work / "ds", args.rows, args.dim, n_shards=args.shards)
        t0 = time.perf_counter()
        build_index(str(work / "ds"), "top", str(work / "ix"), compact=True)
        print(f"build {time.perf_counter() - t0:.1f} s")
    one = SenseIndex(str(work / "ix"))
    ivf = one.ivf()
    rng = np.random.default_rng(0)
    queries = np.asarray(ivf.vectors[rng.choice(len(ivf.vectors), args.queries)], np.float32)
    queries += 0.3 * rng.standard_normal(queries.shape).astype(np.float32)
    timed(one, queries[:3])  # the codes loaded
    want, p50_one = timed(one, queries)
    print(f"one process: p50 {p50_one:.2f} ms, RSS {rss_gb(os.getpid()):.2f} GB")
    spread = SenseIndex(str(work / "ix"))
    t0 = time.perf_counter()
    ray_ivf = scatter(spread, "local", args.actors)
    print(f"{args.actors} actors started in {time.perf_counter() - t0:.1f} s")
    timed(spread, queries[:3])
    got, p50_ray = timed(spread, queries)
    import ray

    pids = ray.get([a.__ray_call__.remote(lambda self: os.getpid()) for a in ray_ivf.actors])
    same = sum(g == w for g, w in zip(got, want, strict=True))
    print(f"Ray: p50 {p50_ray:.2f} ms; actors' RSS "
          f"{', '.join(f'{rss_gb(pid):.2f}' for pid in pids)} GB; "
          f"the same 10 hits in {same} of {len(queries)} searches")


if __name__ == "__main__":
    main()
