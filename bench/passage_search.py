"""Cost of ``elmo pool`` and of search by passage (issue 49), on a dataset already embedded
(e.g. the one ``bench/pooled_features.py`` writes):

    PYTHONPATH=$PWD .venv/bin/python bench/passage_search.py runs/bench-pooled/dataset

- pooling: wall time and the process's peak RSS of ``pool_dataset`` (by sentence, then by
  document, default mix and method), with the token count;
- search: a query's parts, median of ``--queries`` sentences of the corpus: embedding the
  text (the bundled model, one thread), the exact scan (``PassageSearch.nearest``: one
  matrix product over every pooled row), and the hits' text and fields; recall@10 is 1 by
  construction (exact), checked by each query finding itself first;
- scale: the exact scan alone over random unit vectors of the same width, 100k and 1M
  rows (what a larger corpus's sentence table costs per query).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--queries", type=int, default=30)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from pipeline.lookup.pooled.pooling import DEFAULT_METHOD, DEFAULT_MIX
    from pipeline.lookup.pooled.search import (
        PassageSearch,
        passage_vector,
        query_tokens,
    )
    from pipeline.lookup.pooled.store import pool_dataset
    from schemas.dataset import open_dataset

    ds = open_dataset(args.dataset)
    print(f"RSS before pooling: {peak_rss_mb():.0f} MB")
    for by in ("sentence", "document"):
        started = time.perf_counter()
        summary = pool_dataset(ds, DEFAULT_MIX, by, DEFAULT_METHOD, rebuild=True)
        print(f"pool --by {by}: {summary.tokens} tokens -> {summary.rows} rows in "
              f"{time.perf_counter() - started:.1f} s; peak RSS {peak_rss_mb():.0f} MB")

    search = PassageSearch(ds)
    pooled = search.pooled("sentence", DEFAULT_MIX, DEFAULT_METHOD)
    texts = ds_sentences(ds, args.queries)
    search.embed([["warm", "up"]])
    embed_s, scan_s, hits_s, found = [], [], [], 0
    for doc_id, sent_idx, text in texts:
        t0 = time.perf_counter()
        vector = passage_vector(search.embed(query_tokens(text, search.tokenizer)), ds,
                                DEFAULT_MIX, DEFAULT_METHOD)
        t1 = time.perf_counter()
        unit = vector / np.linalg.norm(vector)
        sims = pooled.unit @ unit
        np.argpartition(-sims, 9)[:10]
        t2 = time.perf_counter()
        hits = search.nearest(pooled, vector, 10)
        t3 = time.perf_counter()
        embed_s.append(t1 - t0)
        scan_s.append(t2 - t1)
        hits_s.append(t3 - t2)
        found += (hits[0].doc_id, hits[0].sent_idx) == (doc_id, sent_idx) \
            or hits[0].similarity > 0.9999  # a repeated sentence may come first
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    print(f"search over {len(pooled)} sentences x {pooled.unit.shape[1]}: embed "
          f"{ms(embed_s):.1f} ms, exact scan + top-10 {ms(scan_s):.2f} ms, nearest with "
          f"text and fields {ms(hits_s):.1f} ms (medians of {len(texts)}); "
          f"found itself first {found}/{len(texts)}")

    rng = np.random.default_rng(0)
    width = pooled.unit.shape[1]
    for rows in (100_000, 1_000_000):
        table = rng.standard_normal((rows, width), dtype=np.float32)
        table /= np.linalg.norm(table, axis=1, keepdims=True)
        query = table[123]
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            sims = table @ query
            np.argpartition(-sims, 9)[:10]
            times.append(time.perf_counter() - t0)
        print(f"exact scan + top-10 over {rows:,} x {width} float32: "
              f"{1000 * statistics.median(times):.1f} ms (median of 10)")
        del table


def ds_sentences(ds, n: int) -> list[tuple[str, int, str]]:
    import pyarrow.parquet as pq

    rows = pq.read_table([p for p in ds.paths("sentences")],
                         columns=["doc_id", "sent_idx", "text", "n_tokens"]).to_pylist()
    rows = [r for r in rows if r["n_tokens"] >= 8]
    picks = np.random.default_rng(1).choice(len(rows), min(n, len(rows)), replace=False)
    return [(rows[i]["doc_id"], rows[i]["sent_idx"], rows[i]["text"]) for i in picks]


if __name__ == "__main__":
    main()
