"""`elmo dataset verify` speed: MB/s of committed files checked (read, sha256, footer).

Builds (once, kept under --work) a dataset of a few million tokens with a near-free model
(bench/pipeline_throughput.py's: 2 layers x 32 cells, projection 16, float16 layers),
from copies of austen.txt, then times ``verify_dataset`` over it with 1 and 4 threads,
``--repeats`` times each (the files are in the page cache after the first pass: this
measures hashing and parsing, not the disk), next to plain sha256 of the same bytes.

``--rot`` then measures, per GB of committed files, what each way of catching a byte that
changed after a first check costs a query (docs/dataset_format.md, "Integrity"): reading
every file again (sha256), reading every page with pyarrow's page CRCs checked, and the
version key ``require_intact`` compares (one listing per table folder: size, times,
inode), beside a DuckDB full scan of one layer (what a query itself costs).

    .venv/bin/python bench/verify_throughput.py --copies 3
    .venv/bin/python bench/verify_throughput.py --copies 1 --rot
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import time
from pathlib import Path

from pipeline_throughput import CORPORA, near_free_model

from pipeline.write.config import EmbedConfig, ModelSpec
from pipeline.write.embed import embed_corpus
from schemas.dataset import open_dataset
from schemas.verify import VerifiedFiles, expected_files, verify_dataset, version_keys


def build(work: Path, book: Path, copies: int) -> str:
    out = work / "dataset"
    if (out / "_dataset.json").exists():
        return str(out)
    model = near_free_model(work / "model")
    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for k in range(copies):
        shutil.copy(book, corpus / f"{book.stem}-{k}.txt")
    t0 = time.perf_counter()
    summary = embed_corpus(EmbedConfig(
        sources=[str(corpus / "*.txt")], out=str(out), model=ModelSpec.resolve(str(model)),
        executor="local", progress=False, tokenizer="elmo-store-ptb"))
    print(f"built {summary.tokens:,} tokens in {time.perf_counter() - t0:.0f} s")
    return str(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="runs/bench-verify", help="dataset folder (kept)")
    parser.add_argument("--book", type=Path, default=CORPORA / "austen.txt",
                        help="text to copy (default: the shared corpora's austen.txt)")
    parser.add_argument("--copies", type=int, default=3, help="copies of --book")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rot", action="store_true",
                        help="also the per-query cost of each way to catch rot (s/GB)")
    args = parser.parse_args()
    ds = open_dataset(build(Path(args.work), args.book, args.copies))
    files = expected_files(ds.fs, ds.root)
    total = sum(f.size or 0 for f in files)
    tokens = sum(int(e.rows or 0) for e in files if e.table == "tokens")
    print(f"{len(files)} files, {total / 1e6:.1f} MB, {tokens:,} tokens")
    plain = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for f in files:
            hashlib.sha256(Path(ds.root, f.path).read_bytes()).hexdigest()
        plain.append(time.perf_counter() - t0)
    print(f"plain read + sha256, 1 thread: best {total / 1e6 / min(plain):.0f} MB/s, "
          f"worst {total / 1e6 / max(plain):.0f} MB/s")
    for threads in (1, 4):
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            report = verify_dataset(ds.fs, ds.root, ds.descriptor, threads=threads)
            times.append(time.perf_counter() - t0)
            assert not report.problems and report.bytes_checked == total
        best, worst = min(times), max(times)
        print(f"verify, {threads} thread(s): best {total / 1e6 / best:.0f} MB/s "
              f"({best:.2f} s), worst {total / 1e6 / worst:.0f} MB/s")
    if args.rot:
        rot_costs(ds, files, total, args.repeats)


def rot_costs(ds: object, files: list, total: int, repeats: int) -> None:
    """Seconds per GB of committed files that each check adds to one query, best and
    worst of ``repeats`` (page cache warm: the CPU cost, not the disk's)."""
    import duckdb
    import pyarrow.parquet as pq

    from pipeline.lookup.sql import connect

    def timed(run: object) -> tuple[float, float]:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()  # type: ignore[operator]
            times.append(time.perf_counter() - t0)
        return min(times) / (total / 1e9), max(times) / (total / 1e9)

    def page_crcs() -> None:
        for f in files:
            pq.read_table(Path(ds.root, f.path), page_checksum_verification=True)

    cache = Path(ds.root + "-rot-cache.json")  # not the user's cache
    known = VerifiedFiles(cache)
    keys = version_keys(ds.fs, ds.root, files)
    known.remember(keys.values())

    def version_key() -> None:
        fresh = version_keys(ds.fs, ds.root, files)
        assert all(fresh[f.path] in known for f in files)

    con = connect(ds, con=duckdb.connect(), threads=1)
    last = f"layer_{ds.descriptor.n_output_layers - 1}"

    def duckdb_scan() -> None:
        con.sql(f"SELECT sum(list_sum({last})) FROM tokens").fetchall()

    rows = [("re-read every file (sha256, verify_dataset, 4 threads)",
             lambda: verify_dataset(ds.fs, ds.root, ds.descriptor)),
            ("re-read every page with its CRC (pyarrow)", page_crcs),
            (f"version key: listing + size, mtime, ctime, inode ({len(files)} files)",
             version_key),
            (f"for scale: DuckDB scan of {last} (sum), 1 thread", duckdb_scan)]
    print(f"per-query cost, s per GB of committed files ({total / 1e9:.3f} GB):")
    for name, run in rows:
        best, worst = timed(run)
        print(f"  {name}: best {best:.4f} s/GB, worst {worst:.4f} s/GB")
    cache.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
