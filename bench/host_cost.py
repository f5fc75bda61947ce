"""Where a token's host time goes: CPU microseconds per token of each stage of an item.

One command, the first thing to read about the pipeline's host side (issue 36):

    .venv/bin/python bench/host_cost.py                      # 3 x 1024, austen.txt
    .venv/bin/python bench/host_cost.py --encoder pyarrow    # the reference writer
    .venv/bin/python bench/host_cost.py --width narrow       # 3 x 32
    .venv/bin/python bench/host_cost.py --width both         # both, and the width's cost

It runs the stages of ``pipeline.work_item.ItemWorker`` one after another in this
process on one thread (torch too), with the near-free model of the chosen width
(bench/near_free_models.py: its own cost is small, so the rest stands out), and times
each with the process's CPU clock (user + system) and counts its minor page faults
(fresh memory touched: a worker fixes glibc's mmap threshold, so every block of 1 MiB
or more is new pages, which is most of the system time at 3 x 1024):

read (text -> documents), tokenize (sentences and windows), char ids (the char CNN's
input, for each distinct token: what a cold token cache computes), model (``embed`` per
unit, its char ids excluded), rows (``rows_of_unit``: the Arrow table of a unit), quantize
(int8 values and scales: each batch as the model stage makes it, ``embed_int8``; each
window's rows in ``rows_of_unit``, or the writer's, for float input; with ``--encoder
pyarrow`` also the Arrow columns), types (layer 0 of each new token: quantized once per
token type of a model call, picked per item, and the types file),
int8 pages (encode and compress the int8 layers' pages), other columns (pyarrow writes the
rest of a row group; with ``--encoder pyarrow`` it writes every column), writer, rest (the
writer's own bookkeeping: buffers, slices, concatenation, casts, the footer), hash (the
sha256 of the file bytes), write (the bytes to the local file system).

The model-only rate is tokens per CPU second of ``embed`` alone. Corpora come from
../shared/corpora, or $ELMO_BENCH_CORPORA.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import resource
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
CORPORA = Path(os.environ.get("ELMO_BENCH_CORPORA", REPO.parent / "shared" / "corpora"))

STAGES = ("read", "tokenize", "char ids", "model", "rows", "quantize", "types", "int8 pages",
          "other columns", "writer, rest", "hash", "write")


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Clock:
    """CPU seconds and minor page faults per stage (``with clock("stage"):``), nested
    stages subtracted."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.faults: dict[str, int] = defaultdict(int)
        self._stack: list[str] = []

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0, f0 = time.process_time(), _minor_faults()
        self._stack.append(stage)
        try:
            yield
        finally:
            self._stack.pop()
            spent, faults = time.process_time() - t0, _minor_faults() - f0
            self.seconds[stage] += spent
            self.faults[stage] += faults
            if self._stack:
                self.seconds[self._stack[-1]] -= spent
                self.faults[self._stack[-1]] -= faults


class TimedSink:
    """The hashing file of ``pipeline.write.item_files`` with its hash and write timed apart."""

    def __init__(self, path: Path, clock: Clock) -> None:
        self.handle = path.open("wb")
        self.digest = hashlib.sha256()
        self.clock = clock
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        with self.clock("hash"):
            self.digest.update(view)
        with self.clock("write"):
            self.handle.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.handle.flush()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            with self.clock("write"):
                self.handle.close()
            self.closed = True


class TimedFiles:
    """Stands in for ``ItemFiles``: files under a temporary folder, written through
    ``TimedSink``."""

    def __init__(self, folder: Path, clock: Clock) -> None:
        self.folder, self.clock = folder, clock
        self.sizes: dict[str, int] = {}

    def open(self, table: str) -> TimedSink:
        return TimedSink(self.folder / f"{table}.parquet", self.clock)

    def closed(self, table: str, handle: TimedSink) -> None:
        handle.close()
        self.sizes[table] = handle.size


def _timed(clock: Clock, stage: str, function: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with clock(stage):
            return function(*args, **kwargs)
    return wrapper


@contextlib.contextmanager
def timing_hooks(clock: Clock) -> Iterator[None]:
    """Time the writer's inner stages where they are called (restored afterwards)."""
    import pyarrow.parquet as pq

    import elmo_model.quantize as model_quantize
    import pipeline.write.item_files as item_files
    import pipeline.write.work_item as work_item
    import schemas.parquet_assembly as assembly

    stage = {(assembly, "encode_chunk"): "int8 pages",
             (item_files, "quantize_int8_indices"): "quantize",
             (item_files, "quantize_int8_into"): "quantize",
             (work_item, "quantized_layer_columns"): "quantize",  # rows_of_unit, per window
             (model_quantize, "quantize_int8_packed"): "quantize",  # the CPU model, per batch
             (model_quantize.TypeQuantizer, "add"): "types",  # layer 0, once per token type
             (item_files, "vector_columns_of"): "quantize",
             (assembly.AssembledParquetWriter, "_other_chunks"): "other columns",
             (pq.ParquetWriter, "write_table"): "other columns",
             (item_files.TokenWriter, "_collect_types"): "types",
             (item_files.TokenWriter, "_write_types"): "types"}
    originals = [(owner, name, getattr(owner, name)) for owner, name in stage]
    for owner, name, function in originals:
        setattr(owner, name, _timed(clock, stage[owner, name], function))
    try:
        yield
    finally:
        for owner, name, function in originals:
            setattr(owner, name, function)


def run(args: argparse.Namespace) -> tuple[Clock, int, dict[str, int]]:
    import numpy as np
    import torch
    from near_free_models import PROJECTIONS, near_free_model

    from elmo_model.char_ids import token_char_ids
    from pipeline.tokenize import model_tokenizer
    from pipeline.write.config import ModelSpec
    from pipeline.write.inputs import ReadOptions, list_sources
    from pipeline.write.item_files import TokenWriter
    from pipeline.write.process_memory import fix_mmap_threshold
    from pipeline.write.read import LineCounter, read_range
    from pipeline.write.work_item import (
        ItemSettings,
        cut_units,
        load_embedder,
        quantizes_on_device,
        rows_of_unit,
        tokenize_item,
    )

    torch.set_num_threads(1)
    fix_mmap_threshold()  # as every worker process does
    clock = Clock()
    work = Path(tempfile.mkdtemp(prefix="host-cost-"))
    model_dir = near_free_model(work / "model", PROJECTIONS[args.width])
    spec = ModelSpec.resolve(str(model_dir))
    embedder = load_embedder(spec, 4096, "float32", "cpu")
    n_out = embedder.config.n_layers + 1
    dim = 2 * embedder.config.projection_dim
    settings = ItemSettings(
        model=spec, tokenizer=model_tokenizer(spec.options), out=str(work), part="main",
        run_id="bench", dtype="int8", n_output_layers=n_out, dim=dim, batch_tokens=4096,
        unit_tokens=4 * 4096, compute_dtype="float32", device="cpu", max_sentence_tokens=200,
        window_overlap=50, read=ReadOptions(), storage_options=None)
    (source,) = list_sources([str(args.corpus)])
    with clock("read"):
        docs = list(read_range(source, 0, source.size, ReadOptions(), None, LineCounter()))
    with clock("tokenize"):
        content = tokenize_item(iter(docs), settings)
    with clock("char ids"):
        distinct = {t for row in content.windows for t in row.tokens}
        np.stack([token_char_ids(t, embedder.config.max_chars) for t in distinct])
    files = TimedFiles(work, clock)
    writer = TokenWriter(files, n_out, dim, "int8", encoder=args.encoder)  # type: ignore[arg-type]
    tokens = 0
    with timing_hooks(clock):
        for rows in cut_units(content.windows, settings.unit_tokens):
            with clock("model"):
                sentences = [r.tokens for r in rows]
                layers = (embedder.submit_int8(sentences, layer_0_per_type=True).result()
                          if quantizes_on_device(embedder, "int8") else embedder.embed(sentences))
            with clock("rows"):
                table = rows_of_unit(rows, layers, n_out, dim, "int8")
            tokens += table.num_rows
            with clock("writer, rest"):
                writer.add(table, getattr(layers, "layer_0", None))
            del table, layers
        with clock("writer, rest"):
            writer.finish()
    clock.seconds["model"] -= clock.seconds["char ids"]  # embed computed them once too
    return clock, tokens, files.sizes


def report(clock: Clock, tokens: int, sizes: dict[str, int], args: argparse.Namespace) -> None:
    total = sum(clock.seconds.values())
    print(f"host cost per token: near-free model, width {args.width}, encoder {args.encoder}, "
          f"{tokens:,} tokens of {args.corpus.name}, one thread")
    print(f"{'stage':<15} {'CPU s':>8} {'us/token':>9} {'share':>6} {'faults/token':>13}")
    for stage in STAGES:
        seconds = clock.seconds.get(stage, 0.0)
        print(f"{stage:<15} {seconds:>8.2f} {seconds / tokens * 1e6:>9.2f} "
              f"{seconds / total:>6.1%} {clock.faults.get(stage, 0) / tokens:>13.2f}")
    faults = sum(clock.faults.values())
    print(f"{'total':<15} {total:>8.2f} {total / tokens * 1e6:>9.2f} {'':>6} "
          f"{faults / tokens:>13.2f}")
    model = clock.seconds["model"] + clock.seconds["char ids"]
    host = total - clock.seconds["model"]
    print(f"model only: {tokens / model:,.0f} tokens per CPU second (char ids included); "
          f"everything else: {host / tokens * 1e6:.1f} us per token")
    print("stored bytes per token: " + ", ".join(
        f"{table} {size / tokens:,.1f}" for table, size in sorted(sizes.items())))


def report_width_cost(wide: tuple[Clock, int], narrow: tuple[Clock, int]) -> None:
    """Per stage, wide minus narrow in us a token: what the issue's width cost is made of
    (both runs embed the same tokens, so the fixed costs cancel but for noise)."""
    (wide_clock, tokens), (narrow_clock, _) = wide, narrow
    print(f"width cost per token (wide - narrow, one thread, {tokens:,} tokens)")
    print(f"{'stage':<15} {'wide':>8} {'narrow':>8} {'width':>8}")
    for stage in (*STAGES, "total"):
        a, b = (sum(c.seconds.values()) if stage == "total" else c.seconds.get(stage, 0.0)
                for c in (wide_clock, narrow_clock))
        print(f"{stage:<15} {a / tokens * 1e6:>8.2f} {b / tokens * 1e6:>8.2f} "
              f"{(a - b) / tokens * 1e6:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPORA / "austen.txt")
    parser.add_argument("--width", choices=("wide", "narrow", "both"), default="wide",
                        help="wide: 3 x 1024 outputs (default); narrow: 3 x 32; both: one "
                             "after the other, then the width's cost per stage")
    parser.add_argument("--encoder", choices=("assembled", "pyarrow"), default="assembled",
                        help="who writes the int8 layer pages (pipeline.write.item_files.ENCODERS)")
    args = parser.parse_args()
    if not args.corpus.is_file():
        raise SystemExit(f"no corpus at {args.corpus}: set ELMO_BENCH_CORPORA")
    if args.width != "both":
        report(*run(args), args)
        return
    results = {}
    for width in ("wide", "narrow"):
        one = argparse.Namespace(**{**vars(args), "width": width})
        clock, tokens, sizes = run(one)
        report(clock, tokens, sizes, one)
        print()
        results[width] = (clock, tokens)
    report_width_cost(results["wide"], results["narrow"])


if __name__ == "__main__":
    main()
