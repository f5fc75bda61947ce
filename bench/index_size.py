"""Sense index size, recall@10 and query latency against the dataset it indexes.

    .venv/bin/python bench/index_size.py --dataset runs/demo/dataset \
        --index old=/tmp/old.lance --index new=runs/demo/index

For each index: its bytes on disk over the dataset's, recall@10 of its default search
(no prefilter: the in-memory IVF where the index has one, else LanceDB's graph with the
index's own parameters; ``--without-ivf`` adds LanceDB's for comparison)
against exact float32 cosine search over every token's mixed vector, read from the
dataset (the same mix), for the same query vectors (random tokens of the dataset, mixed
as stored); and latency of that search (keys only), of sense search's fetch
(``nearest_distinct`` by word form, the sentence text included) and of a plain top-10
with the sentence text.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.lookup.index.sense_index import RESULT_COLUMNS, SenseIndex
from pipeline.lookup.layers.mixes import iter_mixed
from pipeline.lookup.senses.search import nearest_distinct
from schemas.dataset import open_dataset


def dir_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def exact_vectors(dataset: str, mix: str) -> tuple[list[tuple[str, int, int]], list[str],
                                                   np.ndarray]:
    ds = open_dataset(dataset)
    keys, tokens, parts = [], [], []
    for batch, vec in iter_mixed(ds, ds.mix(mix), columns=("doc_id", "sent_idx", "tok_idx",
                                                           "token")):
        rows = pa.Table.from_batches([batch]).to_pydict()
        keys += list(zip(rows["doc_id"], rows["sent_idx"], rows["tok_idx"], strict=True))
        tokens += rows["token"]
        parts.append(np.asarray(vec, np.float32))
    vectors = np.concatenate(parts)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return keys, tokens, vectors


def measure(ix: SenseIndex, keys: list[tuple[str, int, int]], tokens: list[str],
            unit: np.ndarray, picks: np.ndarray, k: int) -> dict[str, float]:
    recalls, vector_ms, plain_ms, sense_ms = [], [], [], []
    for i in picks.tolist():
        query = unit[i]
        truth = {keys[j] for j in np.argsort(-(unit @ query), kind="stable")[:k].tolist()}
        t0 = time.perf_counter()
        found = ix.vector_query(query[None, :], k=k, columns=["doc_id", "sent_idx", "tok_idx"]
                                ).to_arrow().to_pydict()
        vector_ms.append((time.perf_counter() - t0) * 1000)
        got = set(zip(found["doc_id"], found["sent_idx"], found["tok_idx"], strict=True))
        recalls.append(len(truth & got) / k)
        t0 = time.perf_counter()
        ix.vector_query(query[None, :], k=k, columns=RESULT_COLUMNS).to_arrow()
        t1 = time.perf_counter()
        nearest_distinct(ix, query, k, words=[tokens[i]], forms=True)
        t2 = time.perf_counter()
        plain_ms.append((t1 - t0) * 1000)
        sense_ms.append((t2 - t1) * 1000)

    def p(values: list[float], q: float) -> float:
        return float(np.percentile(values, q))

    return {"recall": statistics.fmean(recalls), "vector_p50": p(vector_ms, 50),
            "vector_p95": p(vector_ms, 95), "top10_p50": p(plain_ms, 50),
            "top10_p95": p(plain_ms, 95), "sense_p50": p(sense_ms, 50),
            "sense_p95": p(sense_ms, 95)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--index", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--without-ivf", action="store_true",
                        help="also each index's searches without its in-memory IVF (LanceDB's "
                        "own, NAME/lance)")
    args = parser.parse_args()
    data_bytes = dir_bytes(args.dataset)
    opened = [(spec.partition("=")[0], SenseIndex(spec.partition("=")[2]))
              for spec in args.index]
    keys, tokens, unit = exact_vectors(args.dataset, opened[0][1].meta.mix_name)
    picks = np.random.default_rng(args.seed).choice(len(keys), args.queries, replace=False)
    print(f"dataset {args.dataset}: {data_bytes / 1e6:.1f} MB, {len(keys)} tokens")
    runs = [(name, ix, True) for name, ix in opened]
    if args.without_ivf:
        runs += [(f"{name}/lance", ix, False) for name, ix in opened if ix.ivf()]
    for name, ix, use_ivf in runs:
        ix.use_ivf = use_ivf
        size = dir_bytes(ix.uri)
        # Warm the caches (index files, sentences table) before timing.
        measure(ix, keys, tokens, unit, picks[:5], args.k)
        result = measure(ix, keys, tokens, unit, picks, args.k)
        kind = "compact" if ix.meta.compact else ix.meta.vector_dtype
        print(f"{name:10s} layout {ix.meta.layout} {kind:7s} "
              f"{size / 1e6:7.1f} MB ({size / data_bytes:.2f}x)  recall@{args.k} "
              f"{result['recall']:.3f}  keys only p50 {result['vector_p50']:.1f} ms p95 "
              f"{result['vector_p95']:.1f}  top-10 p50 {result['top10_p50']:.1f} ms "
              f"p95 {result['top10_p95']:.1f}  sense fetch p50 {result['sense_p50']:.1f} ms "
              f"p95 {result['sense_p95']:.1f}")


if __name__ == "__main__":
    main()
