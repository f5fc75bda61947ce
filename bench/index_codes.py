"""How well a compact index's codes rank rows: recall@10 of candidates taken from an IVF's
lists and re-ranked by the exact cosine, for codes made several ways over the same rows.

    .venv/bin/python bench/index_codes.py --index IX --query-dataset Q --step 4 \
        --codes plain/64,rotated/64,kept256/64,kept128/64,kept64/32

Each ``--codes`` entry is ``WAY/BYTES``: ``plain`` (the raw values), ``rotated`` (a fixed
random rotation of all of them) or ``keptN`` (the N strongest principal directions of the
rows' uncentred second moment, rotated: ``pipeline/lookup/index/projection.py``), coded
``PQ<BYTES>``. The rows are every ``--step``-th row of the index IX (its int8 vectors); the
queries 200 of those rows and 200 tokens of the dataset Q (new sentences, same model); the
truth an exact scan. One JSON line per way, probe count and candidates a result
(BENCHMARKS.md, "issue 46: codes in the rows' principal directions").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from index_scale import held_out_queries

TRAIN_ROWS = 70_000


def projection_for(way: str, train: np.ndarray) -> np.ndarray | None:
    from pipeline.lookup.index.projection import principal_projection, random_rotation

    dim = train.shape[1]
    if way == "plain":
        return None
    if way == "rotated":
        return random_rotation(dim).astype(np.float32)
    return principal_projection(train.T @ train / len(train), int(way.removeprefix("kept")))


def main() -> None:
    import faiss

    from pipeline.lookup.index.ivf_build import list_count
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.layers.vectors import unit_vectors

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--query-dataset", required=True)
    parser.add_argument("--step", type=int, default=4)
    parser.add_argument("--codes", default="plain/64,rotated/64,kept256/64,kept64/32")
    parser.add_argument("--nprobe", default="8,16")
    parser.add_argument("--candidates", default="5,10,20,30,60")
    args = parser.parse_args()

    vectors = SenseIndex(args.index).ivf().vectors
    picks = np.arange(0, len(vectors), args.step)
    rows = np.concatenate([unit_vectors(vectors[picks[i:i + 65_536]])
                           for i in range(0, len(picks), 65_536)])
    rng = np.random.default_rng(1)
    queries = {"stored": rows[rng.choice(len(rows), 200, replace=False)],
               "new": held_out_queries(args.query_dataset, 200, 0)}
    flat = faiss.IndexFlatIP(rows.shape[1])
    flat.add(rows)
    truth = {name: flat.search(q, 10)[1] for name, q in queries.items()}
    del flat
    lists = list_count(len(rows))
    train = rows[rng.choice(len(rows), min(TRAIN_ROWS, len(rows)), replace=False)]
    for spec in args.codes.split(","):
        way, _, code_bytes = spec.partition("/")
        t0 = time.time()
        projection = projection_for(way, train)
        width = rows.shape[1] if projection is None else projection.shape[1]
        index = faiss.index_factory(width, f"IVF{lists},PQ{code_bytes}",
                                    faiss.METRIC_INNER_PRODUCT)
        index.do_polysemous_training = False
        index.train(train if projection is None else train @ projection)
        for start in range(0, len(rows), 100_000):
            block = rows[start:start + 100_000]
            index.add(block if projection is None else block @ projection)
        trained = time.time() - t0
        index.parallel_mode = 1
        for nprobe in map(int, args.nprobe.split(",")):
            for candidates in map(int, args.candidates.split(",")):
                out = {"codes": spec, "rows": len(rows), "train_s": round(trained, 1),
                       "nprobe": nprobe, "candidates": candidates}
                for name, q in queries.items():
                    asked = q if projection is None else q @ projection
                    recall, cpu = [], []
                    for i in range(len(q)):
                        c0 = time.process_time()
                        _, found = index.search(np.ascontiguousarray(asked[i:i + 1]),
                                                10 * candidates,
                                                params=faiss.SearchParametersIVF(nprobe=nprobe))
                        cpu.append(time.process_time() - c0)
                        found = found[0][found[0] >= 0]
                        best = found[np.argsort(-(rows[found] @ q[i]))[:10]]
                        recall.append(len(set(best.tolist()) & set(truth[name][i].tolist()))
                                      / 10)
                    out[name] = {"recall_at_10": round(float(np.mean(recall)), 4),
                                 "faiss_cpu_ms": round(1000 * float(np.median(cpu)), 2)}
                print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
