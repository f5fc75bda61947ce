"""A compact sense index at corpus scale: build memory and time, open time, serving memory,
p50 and recall@10, each in a fresh process so that peak RSS is the phase's own.

    .venv/bin/python bench/index_scale.py build --dataset D --out IX      # elmo index build
    .venv/bin/python bench/index_scale.py open --index IX                  # open + 1 search
    .venv/bin/python bench/index_scale.py search --index IX --queries 200  # p50, recall@10
    .venv/bin/python bench/index_scale.py cli --index IX --word the        # elmo senses search
    .venv/bin/python bench/index_scale.py lance-pq --index IX --out T      # LanceDB IVF_PQ
    .venv/bin/python bench/index_scale.py serve --index IX                 # elmo serve

``build`` and ``cli`` run the product's command as a child and report its peak RSS and
CPU seconds (``getrusage`` of the children). ``search`` takes stored rows as queries (each
left in: its own row is a true neighbour) and measures recall@10 against an exact scan of
every row's vector, read from the index's vector files in blocks (memory stays flat), and
the p50 of the default search (keys only). ``lance-pq`` writes the same vectors into a
LanceDB table with LanceDB's own IVF_PQ index on disk and measures the same queries there.
``serve`` times any-word searches over HTTP on one kept client (the same sentence, a new
sentence each time, a new connection each) with the server's CPU a query. To compare two
trees, put ``PYTHONPATH=TREE`` in front: the server and the CLI's child run from it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# As the product's index, senses and serve commands run (pipeline/cli.py): searched here
# in this process, before faiss loads its OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ELMO = str(Path(sys.executable).with_name("elmo"))
KEYS = ["part", "shard", "row"]
# Words of the new sentences `serve` asks (each numbered: no two alike).
QUERY_TEXT = ("a single man in possession of a good fortune must be in want of a wife "
              "however little known the feelings or views of such a man may be")


def child(cmd: list[str], quiet: bool = False) -> dict[str, float]:
    """Run ``cmd``; its wall seconds, CPU seconds and peak RSS (GB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if quiet else None)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "peak_rss_gb": round(after.ru_maxrss / 2**20, 2)}


def rss_gb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def exact_truth(vectors, queries: np.ndarray, k: int, block: int = 65_536) -> np.ndarray:
    """Positions of each unit query's ``k`` nearest rows by exact cosine, a block at a time."""
    from pipeline.lookup.index.ivf_build import exact_nearest

    return exact_nearest(vectors, queries, k, np.full(len(queries), -1, np.int64))


def held_out_queries(dataset: str, n: int, seed: int) -> np.ndarray:
    """``n`` unit vectors of tokens of another dataset embedded with the same model (its
    sentences are not in the index): queries as a user's new sentences give them."""
    from pipeline.lookup.layers.mixes import iter_mixed
    from pipeline.lookup.layers.vectors import unit_vectors
    from schemas.dataset import open_dataset

    ds = open_dataset(dataset)
    parts = [np.asarray(vec, np.float32) for _, vec in iter_mixed(ds, ds.mix("top"),
                                                                  columns=())]
    every = np.concatenate(parts)
    return unit_vectors(every[np.random.default_rng(seed).choice(len(every), n,
                                                                 replace=False)])


def cmd_search(args: argparse.Namespace) -> dict:
    """p50 and recall@10 of the default search (keys only) against an exact scan, for
    stored rows as queries (own row left in) or, with ``--query-dataset``, new ones;
    ``--candidates 30,60,...``: one result per count (the recall / p50 curve)."""
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.layers.vectors import unit_vectors

    t0 = time.perf_counter()
    ix = SenseIndex(args.index)
    ivf = ix.ivf()
    rows = len(ivf.vectors)
    if args.query_dataset:
        queries = held_out_queries(args.query_dataset, args.queries, args.seed)
    else:
        picks = np.sort(np.random.default_rng(args.seed).choice(rows, args.queries,
                                                                replace=False))
        queries = unit_vectors(ivf.vectors[picks])
    truth = exact_truth(ivf.vectors, queries, args.k)
    ivf.search(queries[:1], args.k)  # codes loaded
    opened = time.perf_counter() - t0
    built, probes = ivf.candidates, ivf.nprobe
    results = []
    for count, nprobe in [(int(c), int(p)) for c in str(args.candidates).split(",")
                          for p in str(args.nprobe).split(",")]:
        ivf.candidates = count or built  # candidates a result taken from the lists
        ivf.nprobe = nprobe or probes
        times, cpu, recalls = [], [], []
        for i in range(len(queries)):
            t0, c0 = time.perf_counter(), time.process_time()
            found, _ = ivf.search(queries[i:i + 1], args.k)
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            recalls.append(len(set(found[0].tolist()) & set(truth[i].tolist())) / args.k)
        # CPU milliseconds too: on a shared machine a query's wall time is mostly waiting.
        results.append({"candidates": ivf.candidates, "nprobe": ivf.nprobe,
                        "recall_at_10": round(statistics.fmean(recalls), 4),
                        "p50_ms": round(float(np.percentile(times, 50)), 2),
                        "p95_ms": round(float(np.percentile(times, 95)), 2),
                        "cpu_p50_ms": round(float(np.percentile(cpu, 50)), 2)})
    return {"rows": rows, "queries": "new" if args.query_dataset else "stored",
            "nprobe": ivf.nprobe, "lists": ivf.lists, "built_candidates": built,
            "curve": results, "setup_s_incl_truth": round(opened, 1),
            "rss_gb": round(rss_gb(), 2)}


def cmd_open(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    from pipeline.lookup.index.sense_index import SenseIndex

    imported = time.perf_counter()
    ix = SenseIndex(args.index)
    ivf = ix.ivf()
    opened = time.perf_counter()
    query = np.asarray(ivf.vectors[[0]], np.float32)
    ix.vector_query(query, k=10).to_arrow()
    searched = time.perf_counter()
    return {"import_s": round(imported - t0, 2), "open_s": round(opened - imported, 2),
            "first_search_s": round(searched - opened, 2), "rss_gb": round(rss_gb(), 2),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                                 2)}


def cmd_held(args: argparse.Namespace) -> dict:
    """What a searching process holds for the index, as ``elmo serve`` opens it (sentences
    held, IVF opened), then after every code is loaded and ``--queries`` any-word
    searches: RssAnon and RssFile (kB) at each step, and the anonymous bytes a row the
    loading added. Compare two sizes of index: their difference over the difference of
    rows is what a row costs, free of the process's fixed part."""
    from pipeline.cli import fixed_mmap_threshold
    from pipeline.lookup.index.sense_index import SenseIndex

    fixed_mmap_threshold("serve" if args.fixed_mmap else None)  # as `elmo serve` does
    ix = SenseIndex(args.index)
    ix.hold_sentences()
    ivf = ix.ivf()
    opened = _memory_of(os.getpid())
    _ = ivf.index, ivf.sketch  # every code and sketch loaded, as an any-word search does
    loaded = _memory_of(os.getpid())
    rng = np.random.default_rng(args.seed)
    for pos in rng.choice(len(ivf.vectors), args.queries, replace=False):
        ix.vector_query(np.asarray(ivf.vectors[[int(pos)]], np.float32), k=40).to_arrow()
    searched = _memory_of(os.getpid())
    rows = len(ivf.vectors)
    return {"rows": rows, "opened_kb": opened, "loaded_kb": loaded, "searched_kb": searched,
            "codes_anon_bytes_a_row": round(
                (loaded["RssAnon"] - opened["RssAnon"]) * 1024 / rows, 1)}


def cmd_serve(args: argparse.Namespace) -> dict:
    """``elmo serve DATASET --index IX``: seconds from start to its first sense search
    answered, its RSS then and after the searches, and the any-word p50 over HTTP three
    ways: the same sentence again (its layers kept: the search and HTTP alone), a new
    sentence each time (the query's forward pass too), and the same on a new connection
    each. One client kept for the whole run: ``httpx.post`` makes a client a call, whose
    TLS context alone took 35 of the 40.6 ms first reported here (BENCHMARKS.md, issue 46
    latency). The server's CPU milliseconds a query beside each, and the load average."""
    import httpx

    from pipeline.lookup.index.meta import read_meta

    dataset = read_meta(args.index).dataset
    t0 = time.perf_counter()
    server = subprocess.Popen([ELMO, "serve", dataset, "--index", args.index, "--port",
                               str(args.port), "--no-verify", *_model_flag(args)],
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{args.port}/senses/search"
    ask = {"sentence": args.sentence, "word": args.word, "k": 10}
    try:
        with httpx.Client(timeout=60) as client:
            while True:
                try:
                    if client.post(url, json=ask).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.perf_counter() - t0 > 300:
                    raise RuntimeError("the server stopped or never answered")
                time.sleep(0.1)
            first = time.perf_counter() - t0
            rss_first = _rss_of(server.pid)
            cpu_first = _cpu_of(server.pid)  # a loaded machine's wall: its CPU says more
            same = {**ask, "any_word": True}
            timed = {"same_sentence": _timed(server.pid, args.queries,
                                             lambda _: client.post(url, json=same).status_code),
                     "new_sentence": _timed(server.pid, args.queries,
                                            lambda i: client.post(url, json={
                                                **same, "sentence": _new_sentence(args, i)
                                            }).status_code),
                     "same_sentence_new_connection": _timed(
                         server.pid, args.queries, lambda _: _post_once(args.port, same)),
                     # As this mode first measured: a client (and its TLS context) a call.
                     "same_sentence_httpx_post": _timed(
                         server.pid, args.queries,
                         lambda _: httpx.post(url, json=same, timeout=60).status_code)}
        return {"first_answer_s": round(first, 1), "cpu_s_first": cpu_first,
                "rss_gb_first": rss_first, "rss_gb_after": _rss_of(server.pid),
                "memory_after_kb": _memory_of(server.pid),
                "any_word_p50_ms": timed["same_sentence"]["p50_ms"], **timed,
                "load_average": os.getloadavg()[0]}
    finally:
        server.terminate()
        server.wait()


def _model_flag(args: argparse.Namespace) -> list[str]:
    return ["--model", args.model] if args.model else []


def _new_sentence(args: argparse.Namespace, i: int) -> str:
    """A sentence not asked before (numbered), holding ``--word`` among corpus words."""
    words = QUERY_TEXT.split(" ")
    start = (7 * i) % (len(words) - 8)
    if args.word_at == "middle":  # the query token mid-sentence, as a reader's usually is
        before, after = " ".join(words[start:start + 4]), " ".join(words[start + 4:start + 8])
        return f"{before} {args.word} {after} {i}"
    return f"{args.word} {' '.join(words[start:start + 8])} {i}"


def _timed(pid: int, n: int, ask: Any) -> dict[str, float]:
    """p50 and p90 wall ms of ``n`` calls of ``ask(i)`` (each must answer status 200;
    three more first, untimed) and the server's CPU ms a call."""
    for i in range(3):
        _answered(ask(-1 - i))
    cpu, times = _cpu_of(pid), []
    for i in range(n):
        began = time.perf_counter()
        status = ask(i)
        times.append((time.perf_counter() - began) * 1000)
        _answered(status)
    return {"p50_ms": round(float(np.percentile(times, 50)), 1),
            "p90_ms": round(float(np.percentile(times, 90)), 1),
            "server_cpu_ms": round((_cpu_of(pid) - cpu) * 1000 / n, 1)}


def _answered(status: int) -> None:
    if status != 200:
        raise RuntimeError(f"the server answered {status}")


def _post_once(port: int, body: dict) -> int:
    """One request on a connection of its own (the standard library's client: no TLS
    context made a call); its status."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/senses/search", json.dumps(body),
                           {"Content-Type": "application/json"})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def _memory_of(pid: int) -> dict[str, int]:
    """``RssAnon`` and ``RssFile`` (mapped files' pages) of process ``pid``, kB."""
    with open(f"/proc/{pid}/status") as handle:
        return {line.split(":")[0]: int(line.split()[1]) for line in handle
                if line.startswith(("RssAnon:", "RssFile:", "VmRSS:"))}


def _rss_of(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 2**20, 2)
    return 0.0


def cmd_lance_pq(args: argparse.Namespace) -> dict:
    """LanceDB's IVF_PQ over the same vectors, on disk: build, p50 and recall@10."""
    import lancedb
    import pyarrow as pa
    from lancedb.index import IvfPq

    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.layers.vectors import unit_vectors

    ivf = SenseIndex(args.index).ivf()
    rows, dim = ivf.vectors.shape
    db = lancedb.connect(args.out)
    began = time.perf_counter()
    table = None
    for start in range(0, rows, 65_536):
        block = np.asarray(ivf.vectors.read(start, start + 65_536), np.float32)
        batch = pa.table({"pos": pa.array(np.arange(start, start + len(block))),
                          "vector": pa.FixedSizeListArray.from_arrays(
                              pa.array(block.reshape(-1)), dim)})
        if table is None:
            table = db.create_table("v", data=batch, mode="overwrite")
        else:
            table.add(batch)
    written = time.perf_counter()
    table.create_index("vector", config=IvfPq(distance_type="cosine",
                                              num_sub_vectors=args.sub_vectors))
    built = time.perf_counter()
    picks = np.sort(np.random.default_rng(args.seed).choice(rows, args.queries, replace=False))
    sets = {"stored": unit_vectors(ivf.vectors[picks])}
    if args.query_dataset:  # and new sentences' tokens, on the same table
        sets["new"] = held_out_queries(args.query_dataset, args.queries, args.seed)
    measured = {}
    for name, queries in sets.items():
        truth = exact_truth(ivf.vectors, queries, 10)
        times, recalls = [], []
        for i, query in enumerate(queries):
            t0 = time.perf_counter()
            found = (table.search(query).distance_type("cosine").nprobes(args.nprobes)
                     .refine_factor(args.refine).select(["pos", "_distance"]).limit(10)
                     .to_arrow())
            times.append((time.perf_counter() - t0) * 1000)
            recalls.append(len(set(found["pos"].to_pylist()) & set(truth[i].tolist())) / 10)
        measured[name] = {"recall_at_10": round(statistics.fmean(recalls), 4),
                          "p50_ms": round(float(np.percentile(times, 50)), 2)}
    disk = sum(f.stat().st_size for f in Path(args.out).rglob("*") if f.is_file())
    return {"rows": rows, "write_s": round(written - began, 1),
            "index_s": round(built - written, 1), **measured, "disk_bytes": disk,
            "nprobes": args.nprobes,
            "refine": args.refine, "sub_vectors": args.sub_vectors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    build = sub.add_parser("build")
    build.add_argument("--dataset", required=True)
    build.add_argument("--out", required=True)
    build.add_argument("--mix", default="top")
    for name in ("open", "search", "cli", "lance-pq", "serve", "held"):
        each = sub.add_parser(name)
        each.add_argument("--index", required=True)
        each.add_argument("--queries", type=int, default=200)
        each.add_argument("--k", type=int, default=10)
        each.add_argument("--seed", type=int, default=0)
        each.add_argument("--word", default="the")
        # Holds the word: "the" is the most rows a word filter leaves (5% of a corpus).
        each.add_argument("--sentence", default="It was the truth universally acknowledged")
        each.add_argument("--out")
        each.add_argument("--nprobes", type=int, default=20)
        each.add_argument("--refine", type=int, default=10)
        each.add_argument("--sub-vectors", type=int, default=64)
        each.add_argument("--port", type=int, default=8391)
        each.add_argument("--word-at", choices=("start", "middle"), default="start",
                          help="serve: where --word sits in each new sentence")
        each.add_argument("--model", metavar="DIR", help="serve, cli: the model directory "
                          "(default: the dataset's recorded one)")
        each.add_argument("--candidates", default="0",
                          help="search: candidates a result from the lists, comma-separated "
                               "(0: the index's)")
        each.add_argument("--fixed-mmap", action="store_true",
                          help="held: fix glibc's mmap threshold as `elmo serve` does")
        each.add_argument("--nprobe", default="0",
                          help="search: lists probed, comma-separated (0: the index's)")
        each.add_argument("--query-dataset",
                          help="search, lance-pq: queries from this dataset's tokens (same "
                               "model, sentences not in the index) instead of stored rows")
    args = parser.parse_args()
    if args.what == "build":
        result = child([ELMO, "index", "build", args.dataset, "--mix", args.mix, "--out",
                        args.out, "--no-progress"])
    elif args.what == "cli":
        result = {**child([ELMO, "senses", "search", args.sentence, "--word", args.word,
                           "--index", args.index, "-k", "10", *_model_flag(args)],
                          quiet=True), "load_average": os.getloadavg()[0]}
    else:
        result = {"open": cmd_open, "search": cmd_search, "lance-pq": cmd_lance_pq,
                  "serve": cmd_serve, "held": cmd_held}[
            args.what](args)
    print(json.dumps({"what": args.what, **result}))


if __name__ == "__main__":
    main()
