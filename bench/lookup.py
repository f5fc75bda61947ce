"""Lookup-layer benchmark: mixing on read, SQL, and the LanceDB sense index.

    .venv/bin/python bench/lookup.py                        # 100k tokens, dim 1024
    .venv/bin/python bench/lookup.py --tokens 1000000 --dim 256 --skip-sql
    .venv/bin/python bench/lookup.py --tokens 100000 --sweep   # nprobes x ef table
    .venv/bin/python bench/lookup.py --dataset runs/demo/dataset  # mix on read, real data

A synthetic dataset in the real layout (``_dataset.json``, committed manifest entries,
hive-partitioned Parquet written with the pipeline's settings: float16 layers without
dictionary encoding, the pipeline's codecs, ~64 MB row groups) stands in for an embedded corpus,
because embedding 100k+ tokens with a real biLM takes hours on this machine. Vectors
imitate contextual embeddings: a Zipf-distributed vocabulary, each word a random centre
with 1-4 "sense" offsets, plus per-occurrence context noise; layer 0 is the bare word
centre (context free), layer 1 and 2 add sense and noise. Random float16 compresses
about as badly as real activations (6 KB per 3x1024 token either way).

Reported: mix-on-read tokens/s (``top`` reads 1 layer, ``average`` 3) with the direct
Parquet reader on 1 and 2 threads, with and without metadata columns, and with pyarrow
decoding the layers instead, interleaved run by run (medians); the same mixes through the
DuckDB ``elmo_mix`` UDF and the precomputed ``materialize_mix`` table; latency of typical
SQL queries; ``elmo index build`` time (mix + read + add + IVF_HNSW_SQ); recall@10 and
p50/p95 latency vs exact numpy search through the product path (``SenseIndex.vector_query``)
and, beside each, LanceDB's sync query builder with the same settings; queries/s with
``--batch`` query vectors a call (both paths, alternated); without and with a ``token = ...``
prefilter (both the product path, which goes exact for small filters, and the forced ANN
path), with the
``token_stem = ...`` prefilter sense search uses by default, and sense search's own
distinct-context fetch (``nearest_distinct``; the query's embedding not included).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.meta import SearchParams
from pipeline.lookup.index.sense_index import SenseIndex
from pipeline.lookup.layers.mixes import iter_mixed
from pipeline.lookup.senses.search import nearest_distinct
from schemas import STORAGE_DTYPES
from schemas.dataset import open_dataset

# The synthetic dataset is the tests' (tests/synthetic_dataset.py); this script times on it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from synthetic_dataset import write_synthetic


def best_rate(fn, n: int, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return n / min(times), min(times)


def _force_pyarrow_reader() -> contextlib.AbstractContextManager:
    """Mix on read with pyarrow decoding every layer column (the reader before
    ``pipeline.lookup.layers.parquet`` and ``pipeline.lookup.layers.int8``): the direct
    readers decline every column."""
    import pipeline.lookup.layers.mixes as mixes

    @contextlib.contextmanager
    def patched() -> Iterator[None]:
        originals = mixes.vector_columns, mixes.int8_columns
        mixes.vector_columns = lambda *args, **kwargs: {}  # type: ignore[assignment]
        mixes.int8_columns = lambda *args, **kwargs: {}  # type: ignore[assignment]
        try:
            yield
        finally:
            mixes.vector_columns, mixes.int8_columns = originals  # type: ignore[assignment]

    return patched()


def bench_mix(ds_uri: str, n: int, repeat: int) -> dict[str, float]:
    """Mix-on-read tokens/s, variants interleaved run by run (medians and bests)."""
    ds = open_dataset(ds_uri)
    meta = ("doc_id", "sent_idx", "tok_idx", "token")
    variants = []
    for name in ("top", "average"):
        for workers in (1, 2):
            variants.append((f"{name}, direct reader, {workers} thread(s), no metadata",
                             name, workers, (), False))
            variants.append((f"{name}, direct reader, {workers} thread(s), 4 metadata columns",
                             name, workers, meta, False))
        variants.append((f"{name}, pyarrow reader, 2 threads, 4 metadata columns",
                         name, 2, meta, True))
    times: dict[str, list[float]] = {label: [] for label, *_ in variants}
    for _ in range(repeat):
        for label, name, workers, columns, pyarrow_only in variants:
            mix = ds.mix(name)
            context = _force_pyarrow_reader() if pyarrow_only else contextlib.nullcontext()
            with context:
                t0 = time.perf_counter()
                total = sum(len(v) for _, v in iter_mixed(ds, mix, columns=columns,
                                                          workers=workers))
                times[label].append(time.perf_counter() - t0)
            assert total == n, (total, n)
    out = {}
    for label, ts in times.items():
        median, best = n / statistics.median(ts), n / min(ts)
        out[f"mix::{label}"] = {"median_tok_s": median, "best_tok_s": best}
        print(f"  mix {label:58s}: median {median:>12,.0f} tokens/s (best {best:,.0f})")
    return out


def bench_sql(ds_uri: str, n: int, repeat: int, top_vectors: np.ndarray,
              words: np.ndarray) -> dict[str, float]:
    from pipeline.lookup.sql import connect, materialize_mix

    out = {}
    con = connect(ds_uri)
    try:
        q = ("SELECT sum(elmo_mix(layer_0, layer_1, layer_2, 'top')[1]) FROM tokens")
        rate, secs = best_rate(lambda: con.sql(q).fetchall(), n, repeat)
        out["sql_udf_top_tok_s"] = rate
        print(f"  SQL elmo_mix top     : {rate:>12,.0f} tokens/s ({secs:.2f} s)")
        q = ("SELECT sum(elmo_mix(layer_0, layer_1, layer_2, 'average')[1]) FROM tokens")
        rate, secs = best_rate(lambda: con.sql(q).fetchall(), n, repeat)
        out["sql_udf_average_tok_s"] = rate
        print(f"  SQL elmo_mix average : {rate:>12,.0f} tokens/s ({secs:.2f} s)")
        t0 = time.perf_counter()
        materialize_mix(con, ds_uri, "top")
        secs = time.perf_counter() - t0
        out["sql_materialize_top_tok_s"] = n / secs
        print(f"  materialize_mix top  : {n / secs:>12,.0f} tokens/s ({secs:.2f} s)")
        frequent = f"w{np.bincount(words).argsort()[-50]}"  # a mid-frequency word
        queries = {
            "token counts (group by, top 10)":
                ("SELECT token, count(*) n FROM tokens GROUP BY token ORDER BY n DESC LIMIT 10",
                 None),
            "one word's occurrences, cosine to one, UDF":
                ("SELECT doc_id, sent_idx, tok_idx, elmo_cosine(elmo_mix(layer_0, layer_1, "
                 "layer_2, 'top'), $v) s FROM tokens WHERE token = $w ORDER BY s DESC LIMIT 10",
                 {"w": frequent, "v": top_vectors[0].tolist()}),
            "one word's occurrences, cosine, materialized":
                ("SELECT doc_id, sent_idx, tok_idx, array_cosine_similarity(vector, "
                 f"$v::FLOAT[{top_vectors.shape[1]}]) s FROM mix_top WHERE token = $w "
                 "ORDER BY s DESC LIMIT 10", {"w": frequent, "v": top_vectors[0].tolist()}),
            "top-10 cosine over all tokens, materialized":
                ("SELECT doc_id, sent_idx, tok_idx, array_cosine_similarity(vector, "
                 f"$v::FLOAT[{top_vectors.shape[1]}]) s FROM mix_top ORDER BY s DESC LIMIT 10",
                 {"v": top_vectors[0].tolist()}),
        }
        for label, (sql, params) in queries.items():
            times = []
            for _ in range(max(3, repeat)):
                t0 = time.perf_counter()
                con.sql(sql, params=params).fetchall()
                times.append(time.perf_counter() - t0)
            out[f"sql_ms::{label}"] = 1000 * statistics.median(times)
            print(f"  SQL {label:45s}: median {1000 * statistics.median(times):8.1f} ms")
    finally:
        con.close()
    return out


def exact_topk(vectors_unit: np.ndarray, q: np.ndarray, k: int,
               rows: np.ndarray | None = None) -> np.ndarray:
    base = vectors_unit if rows is None else vectors_unit[rows]
    sims = base @ (q / np.linalg.norm(q))
    top = np.argpartition(-sims, min(k, len(sims) - 1))[:k]
    top = top[np.argsort(-sims[top])]
    return top if rows is None else rows[top]


def _keys(table: pa.Table) -> list[tuple]:
    return list(zip(table["doc_id"].to_pylist(), table["sent_idx"].to_pylist(),
                    table["tok_idx"].to_pylist(), strict=True))


def read_back(ds_uri: str) -> dict[str, object]:
    """Top-layer vectors, word ids and keys of a synthetic dataset, read through the product
    (for ``--reuse``: no regeneration)."""
    ds = open_dataset(ds_uri)
    vectors, words, keys = [], [], []
    for meta, v in iter_mixed(ds, ds.mix("top")):
        vectors.append(v)
        words.append(np.array([int(t[1:]) for t in meta.column("token").to_pylist()]))
        keys.extend(zip(meta.column("doc_id").to_pylist(), meta.column("sent_idx").to_pylist(),
                        meta.column("tok_idx").to_pylist(), strict=True))
    return {"top": np.concatenate(vectors), "words": np.concatenate(words), "keys": keys}


def _hits_table(hits: list) -> pa.Table:
    return pa.table({"doc_id": [h.doc_id for h in hits], "sent_idx": [h.sent_idx for h in hits],
                     "tok_idx": [h.tok_idx for h in hits]})


@contextlib.contextmanager
def _search_settings(ix: SenseIndex, nprobes: int, ef: int, refine: int | None
                     ) -> Iterator[None]:
    """The index searched with these graph settings (its metadata's, for the moment)."""
    kept = ix.meta.search
    ix.meta.search = SearchParams(nprobes, ef, refine)
    try:
        yield
    finally:
        ix.meta.search = kept


def _forced_graph(ix: SenseIndex, q: np.ndarray, word: str, cols: list[str]) -> pa.Table:
    """A word-prefiltered product search that takes the graph however few rows pass."""
    import pipeline.lookup.index.sense_index as index_module

    kept = index_module.EXACT_FILTER_VALUES
    index_module.EXACT_FILTER_VALUES = 0
    try:
        return ix.search(q, k=10, words=[word], columns=cols)
    finally:
        index_module.EXACT_FILTER_VALUES = kept


def bench_batched(ix: SenseIndex, queries: np.ndarray, truth: list[np.ndarray], keys: list,
                  cols: list[str], batch: int, repeat: int = 3) -> dict[str, object]:
    """Queries/s with ``batch`` query vectors per call (default settings, no filter): the
    product path (``vector_query``) and LanceDB's sync API, alternated, best of ``repeat``."""
    chunks = [slice(i, i + batch) for i in range(0, len(queries), batch)]

    def product(part: np.ndarray) -> pa.Table:
        return ix.vector_query(part, 10, columns=cols).to_arrow()

    def plain(part: np.ndarray) -> pa.Table:
        p = ix.meta.search
        s = ix.table.search(list(part)).distance_type("cosine").nprobes(p.nprobes).ef(p.ef)
        if p.refine_factor:
            s = s.refine_factor(p.refine_factor)
        return s.select([*cols, "_distance"]).limit(10).to_arrow()

    out: dict[str, object] = {}
    best = {"product": float("inf"), "plain": float("inf")}
    recall: dict[str, float] = {}
    for _ in range(repeat):
        for name, run in (("product", product), ("plain", plain)):
            t0 = time.perf_counter()
            tables = [run(queries[c]) for c in chunks]
            best[name] = min(best[name], time.perf_counter() - t0)
            rec = []
            for c, table in zip(chunks, tables, strict=True):
                which = table["query_index"].to_numpy() if "query_index" in \
                    table.column_names else np.zeros(table.num_rows, int)
                for j, want in enumerate(truth[c]):
                    got = set(_keys(table.filter(pa.array(which == j))))
                    rec.append(len(got & {keys[i] for i in want}) / len(want))
            recall[name] = float(np.mean(rec))
    for name, label in (("product", "vector_query"), ("plain", "LanceDB sync API")):
        rate = len(queries) / best[name]
        out[f"batched_{batch}_{name}"] = {"queries_s": rate, "recall": recall[name]}
        print(f"  batched, {batch} vectors a call, {label:17s}: {rate:8,.0f} queries/s "
              f"({1000 / rate:.2f} ms each), recall@10 {recall[name]:.3f}")
    return out


def bench_index(ds_uri: str, out_uri: str, data: dict, n_queries: int,
                grid: list[tuple[int, int, int | None]], rng: np.random.Generator,
                build: bool = True, batch: int = 32, flat: bool = True) -> dict[str, object]:
    result: dict[str, object] = {}
    if build:
        t0 = time.perf_counter()
        summary = build_index(ds_uri, "top", out_uri, kind="hnsw", rebuild=True,
                              compact=False)
        result["build_s"] = time.perf_counter() - t0
        print(f"  {summary.line()}")
    ix = SenseIndex(out_uri)
    top, words = data["top"], data["words"]
    n = len(top)
    unit = top / np.linalg.norm(top, axis=1, keepdims=True)
    keys = data.get("keys")
    if keys is None:  # key of row i, as write_synthetic stores it
        idx = np.arange(n)
        keys = [(f"doc{s // 10}", int(s % 10), int(t)) for s, t in zip(idx // 20, idx % 20,
                                                                         strict=True)]
    picks = rng.choice(n, n_queries, replace=False)
    # A query is a new context of an existing occurrence's word: its vector plus noise.
    queries = top[picks] + 0.3 * rng.standard_normal(top[picks].shape).astype(np.float32)
    truth = [exact_topk(unit, q, 10) for q in queries]

    def measure(label: str, search, truth_rows, limit: int | None = None
                ) -> tuple[float, float, float]:
        lat, rec = [], []
        for q, want in list(zip(queries, truth_rows, strict=True))[:limit]:
            t = time.perf_counter()
            got = search(q)
            lat.append(1000 * (time.perf_counter() - t))
            want_keys = {keys[i] for i in want}
            rec.append(len(want_keys & set(_keys(got)[:10])) / max(1, len(want_keys)))
        p50, p95 = np.percentile(lat, 50), np.percentile(lat, 95)
        print(f"  {label:52s} recall@10 {np.mean(rec):.3f}  p50 {p50:6.1f} ms  "
              f"p95 {p95:6.1f} ms")
        return float(np.mean(rec)), float(p50), float(p95)

    cols = ["doc_id", "sent_idx", "tok_idx"]

    def plain(nprobes: int, ef: int, refine: int | None = None):
        """LanceDB's sync query builder, as the index ran it before its own search path."""
        def run(q: np.ndarray) -> pa.Table:
            s = ix.table.search(q).distance_type("cosine").nprobes(nprobes).ef(ef)
            if refine:
                s = s.refine_factor(refine)
            return s.select([*cols, "_distance"]).limit(10).to_arrow()
        return run

    def ann(nprobes: int, ef: int, refine: int | None = None):
        """The product path (``SenseIndex.vector_query``) with these graph settings."""
        def run(q: np.ndarray) -> pa.Table:
            with _search_settings(ix, nprobes, ef, refine):
                return ix.vector_query(q.reshape(1, -1), 10, columns=cols).to_arrow()
        return run

    p = ix.meta.search
    # Steady state, not first touch: one unmeasured pass over every query (the machine's
    # proactive reclaim evicts an idle multi-GB index from the page cache).
    for q in queries:
        plain(max(20, p.nprobes), p.ef, p.refine_factor)(q)
    held = ix.ivf()
    if held is not None:
        for q in queries:  # the same unmeasured first pass
            ix.vector_query(q.reshape(1, -1), 10, columns=cols).to_arrow()
        lists = held.lists
        r, p50, p95 = measure(
            f"in-memory IVF, {lists} lists, {held.nprobe} probed (product path)",
            lambda q: ix.vector_query(q.reshape(1, -1), 10, columns=cols).to_arrow(), truth)
        result["held_ivf"] = {"recall": r, "p50_ms": p50, "p95_ms": p95,
                              "nprobe": held.nprobe, "lists": lists}
    # The LanceDB rows: the product path with the in-memory IVF set aside.
    ix.use_ivf = False
    grid = [(p.nprobes, p.ef, p.refine_factor), *grid]
    for nprobes, ef, refine in grid:
        label = f"nprobes={nprobes} ef={ef} refine={refine}"
        if (nprobes, ef, refine) == grid[0]:
            label += " (LanceDB default)"
        r, p50, p95 = measure(f"ANN {label}", ann(nprobes, ef, refine), truth)
        result[f"ann_{nprobes}_{ef}_{refine}"] = {"recall": r, "p50_ms": p50, "p95_ms": p95}
        r, p50, p95 = measure(f"  LanceDB sync API, {label}", plain(nprobes, ef, refine),
                              truth)
        result[f"plain_{nprobes}_{ef}_{refine}"] = {"recall": r, "p50_ms": p50,
                                                    "p95_ms": p95}
    ix.use_ivf = True
    result.update(bench_batched(ix, queries, truth, keys, cols, batch))
    if flat:  # a flat scan takes seconds per query at 1M x 1024: 20 queries say enough
        r, p50, p95 = measure("exact (LanceDB flat scan, 20 queries)",
                              lambda q: ix.search(q, k=10, exact=True, columns=cols), truth,
                              limit=20)
        result["flat_scan"] = {"recall": r, "p50_ms": p50, "p95_ms": p95}
    t = time.perf_counter()
    for q in queries:
        exact_topk(unit, q, 10)
    result["numpy_exact_ms"] = 1000 * (time.perf_counter() - t) / len(queries)
    print(f"  numpy brute force: {result['numpy_exact_ms']:.1f} ms/query")

    # Prefilter: the query's own word (token = ...).
    word_of = [f"w{words[i]}" for i in picks]
    rows_of = {w: np.flatnonzero(words == int(w[1:])) for w in set(word_of)}
    truth_f = [exact_topk(unit, q, 10, rows_of[w]) for q, w in zip(queries, word_of,
                                                                    strict=True)]
    it = iter(word_of)
    r, p50, p95 = measure("prefilter token=w, product path (SenseIndex.search)",
                          lambda q: ix.search(q, k=10, words=[next(it)], columns=cols),
                          truth_f)
    result["prefilter_product"] = {"recall": r, "p50_ms": p50, "p95_ms": p95}
    it = iter(word_of)
    r, p50, p95 = measure("prefilter token=w, forced ANN (default params)",
                          lambda q: _forced_graph(ix, q, next(it), cols), truth_f)
    result["prefilter_ann"] = {"recall": r, "p50_ms": p50, "p95_ms": p95}
    # What `elmo senses search` asks by default: the word's forms (token_stem = stem; a
    # synthetic word is its own stem, so the truth is the same), distinct contexts only.
    it = iter(word_of)
    r, p50, p95 = measure("prefilter token_stem=s (word forms), product path",
                          lambda q: ix.search(q, k=10, words=[next(it)], columns=cols,
                                              forms=True), truth_f)
    result["prefilter_forms"] = {"recall": r, "p50_ms": p50, "p95_ms": p95}
    it = iter(word_of)
    r, p50, p95 = measure("senses search: forms, distinct contexts (nearest_distinct)",
                          lambda q: _hits_table(nearest_distinct(ix, q, 10, [next(it)],
                                                                 forms=True)), truth_f)
    result["senses_search"] = {"recall": r, "p50_ms": p50, "p95_ms": p95}
    counts = np.array([len(rows_of[w]) for w in word_of])
    print(f"  (query words have {np.median(counts):.0f} rows median, {counts.max()} max)")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--skip-sql", action="store_true")
    parser.add_argument("--dtype", choices=STORAGE_DTYPES, default="float16",
                        help="storage dtype of the synthetic dataset")
    parser.add_argument("--skip-index", action="store_true")
    parser.add_argument("--skip-flat", action="store_true", help="no exact flat-scan row")
    parser.add_argument("--batch", type=int, default=32,
                        help="query vectors per call in the batched row (default 32)")
    parser.add_argument("--sweep", action="store_true", help="nprobes x ef grid")
    parser.add_argument("--grid", help="ANN settings to measure besides the defaults, as "
                        "nprobes/ef/refine triples: '10/100/5,20/100/-'")
    parser.add_argument("--reuse", action="store_true", help="with --workdir: reuse the "
                        "dataset and index left there by an earlier run (no build)")
    parser.add_argument("--workdir", help="keep the synthetic data here (default: temp)")
    parser.add_argument("--dataset", help="only the mix-on-read benchmark, on this existing "
                        "dataset (e.g. runs/demo/dataset from `make run`)")
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args()

    if args.dataset:
        ds = open_dataset(args.dataset)
        n = sum(pq.read_metadata(path).num_rows for path in ds.paths("tokens"))
        print(f"lookup bench, mix on read: {args.dataset}, {n:,} tokens, dim "
              f"{ds.descriptor.dim}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}")
        results = bench_mix(args.dataset, n, args.repeat)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=float))
        return 0
    work = Path(args.workdir or tempfile.mkdtemp(prefix="elmo-lookup-bench-"))
    ds_dir = work / f"ds-{args.tokens}-{args.dim}"
    rng = np.random.default_rng(1)
    print(f"lookup bench: {args.tokens:,} tokens, dim {args.dim}, {os.cpu_count()} cpus, "
          f"load {os.getloadavg()[0]:.1f}")
    ix_dir = work / f"ix-{args.tokens}-{args.dim}"
    reuse = args.reuse and ds_dir.exists() and ix_dir.exists()
    grid = [(20, 100, None), (40, 100, 5), (80, 150, 5), (40, 200, 10)] if args.sweep else []
    for triple in (args.grid or "").split(","):
        if triple:
            nprobes, ef, refine = triple.split("/")
            grid.append((int(nprobes), int(ef), None if refine == "-" else int(refine)))
    results: dict[str, object] = {"tokens": args.tokens, "dim": args.dim}
    if reuse:
        data = read_back(str(ds_dir))
        print(f"  reusing {ds_dir} and {ix_dir}")
        results.update(bench_index(str(ds_dir), str(ix_dir), data, args.queries, grid, rng,
                                   build=False, batch=args.batch, flat=not args.skip_flat))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=float))
        return 0
    if ds_dir.exists():
        shutil.rmtree(ds_dir)
    t0 = time.perf_counter()
    data = write_synthetic(ds_dir, args.tokens, args.dim, dtype=args.dtype)
    print(f"  wrote synthetic dataset in {time.perf_counter() - t0:.1f} s "
          f"({sum(f.stat().st_size for f in ds_dir.rglob('*.parquet')) / 1e6:,.0f} MB)")
    results.update(bench_mix(str(ds_dir), args.tokens, args.repeat))
    if not args.skip_sql:
        results.update(bench_sql(str(ds_dir), args.tokens, args.repeat, data["top"],
                                 data["words"]))
    if not args.skip_index:
        results.update(bench_index(str(ds_dir), str(ix_dir), data, args.queries, grid, rng,
                                   batch=args.batch, flat=not args.skip_flat))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
