"""`elmo dataset verify` speed: MB/s of committed files checked (read, sha256, footer).

Builds (once, kept under --work) a dataset of a few million tokens with a near-free model
(bench/pipeline_throughput.py's: 2 layers x 32 cells, projection 16, float16 layers),
from copies of austen.txt, then times ``verify_dataset`` over it with 1 and 4 threads,
``--repeats`` times each (the files are in the page cache after the first pass: this
measures hashing and parsing, not the disk), next to plain sha256 of the same bytes.

    .venv/bin/python bench/verify_throughput.py --copies 3
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
from schemas.verify import expected_files, verify_dataset


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


if __name__ == "__main__":
    main()
