"""int8 layer pages: CPU per row and bytes per row of each way to store them.

    .venv/bin/python bench/int8_pages.py [--tokens 20000] [--repeat 3]

The values are real: the wide near-free model's layers 1 and 2 (bench/near_free_models.py,
3 x 1024 outputs) over the first ``--tokens`` tokens of austen.txt, quantized to int8 as
the pipeline stores them. Each way is timed on one thread with the process CPU clock
(median of ``--repeat``), per row of 1,024 values:

* pyarrow's writer on ``fixed_size_list<int8>`` (the reference: dictionary, PLAIN,
  BYTE_STREAM_SPLIT on the INT32 that holds an int8; codecs), and the same bytes as
  ``fixed_size_binary(1024)`` (no list machinery: a lower bound for pyarrow);
* ``schemas.int8_column_chunk`` (our pages: dictionary indices, bit width 8): codecs and
  zstd levels, page sizes;
* quantizing (reference ``quantize_int8`` and the compiled ``quantize_int8_indices``),
  CRC-32 of the stored bytes (zlib-ng) and their sha256 (hashlib);
* whether encoding releases the GIL: the same chunks on two threads at once against one
  after the other (wall time; about 2x faster on two idle cores if it does).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def layer_values(tokens: int) -> Any:
    """``[rows, 1024]`` float32: layers 1 and 2 of the wide near-free model, stacked."""
    import numpy as np
    import torch
    from host_cost import CORPORA
    from near_free_models import PROJECTIONS, near_free_model

    from pipeline.write.config import ModelSpec
    from pipeline.write.work_item import load_embedder

    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="int8-pages-"))
    spec = ModelSpec.resolve(str(near_free_model(folder / "wide", PROJECTIONS["wide"])))
    embedder = load_embedder(spec, 4096, "float32", "cpu")
    sentences, count = [], 0
    with (CORPORA / "austen.txt").open(encoding="utf-8") as handle:
        for line in handle:
            words = line.split()[:100]
            if words:
                sentences.append(words)
                count += len(words)
            if count >= tokens:
                break
    layers = embedder.embed(sentences)
    return np.concatenate([np.concatenate([a[1], a[2]]) for a in layers])


def cpu_us_per_row(function: Any, rows: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        function()
        times.append(time.process_time() - t0)
    return statistics.median(times) / rows * 1e6


def pyarrow_rows(q: Any, repeat: int) -> list[tuple[str, float, float]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, dim = q.shape
    lists = pa.table({"v": pa.FixedSizeListArray.from_arrays(pa.array(q.reshape(-1)), dim)})
    binary = pa.table({"v": pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(dim), rows, [None, pa.py_buffer(q.tobytes())])})
    ways = {
        "pyarrow list<int8> dictionary + zstd": (lists, {"compression": "zstd"}),
        "pyarrow list<int8> dictionary, none": (lists, {"compression": "none"}),
        "pyarrow list<int8> PLAIN + zstd": (lists, {"compression": "zstd",
                                                    "use_dictionary": False}),
        "pyarrow list<int8> BYTE_STREAM_SPLIT + zstd": (
            lists, {"compression": "zstd", "use_dictionary": False,
                    "use_byte_stream_split": ["v.list.element"]}),
        "pyarrow fixed_size_binary + zstd": (binary, {"compression": "zstd"}),
        "pyarrow fixed_size_binary + lz4": (binary, {"compression": "lz4"}),
    }
    out = []
    for name, (table, options) in ways.items():
        sink = io.BytesIO()

        def write(table: Any = table, options: dict = options, sink: io.BytesIO = sink) -> None:
            sink.seek(0)
            sink.truncate()
            pq.write_table(table, sink, write_page_checksum=True, **options)
        us = cpu_us_per_row(write, rows, repeat)
        out.append((name, us, len(sink.getvalue()) / rows))
    return out


def our_rows(indices: Any, repeat: int) -> list[tuple[str, float, float]]:
    from schemas.int8_column_chunk import ChunkCodec, encode_chunk

    rows, dim = indices.shape
    ways = [("zstd", 1, 1 << 20), ("zstd", 3, 1 << 20), ("zstd", -1, 1 << 20),
            ("zstd", 1, 64 << 10), ("zstd", 1, 256 << 10), ("zstd", 1, 4 << 20),
            ("lz4_raw", None, 1 << 20), ("snappy", None, 1 << 20),
            ("uncompressed", None, 1 << 20)]
    out = []
    for codec_name, level, page_bytes in ways:
        codec = ChunkCodec(codec_name, level)
        page_rows = max(1, page_bytes // dim)
        size = sum(memoryview(p).nbytes for p in encode_chunk(indices, 1, 2, codec,
                                                            page_rows).pieces)
        us = cpu_us_per_row(lambda c=codec, p=page_rows: encode_chunk(indices, 1, 2, c, p),
                            rows, repeat)
        level_name = "" if level is None else f" {level}"
        out.append((f"ours, dictionary indices + {codec_name}{level_name}, "
                    f"{page_bytes >> 10} KB pages", us, size / rows))
    return out


def gil_ratio(indices: Any) -> float:
    """Wall time of two encodes one after the other over two at once on two threads."""
    from schemas.int8_column_chunk import ChunkCodec, encode_chunk

    def encode() -> None:
        encode_chunk(indices, 1, 2, ChunkCodec("zstd"), 1024)

    t0 = time.perf_counter()
    encode()
    encode()
    serial = time.perf_counter() - t0
    threads = [threading.Thread(target=encode) for _ in range(2)]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return serial / (time.perf_counter() - t0)


def main() -> None:
    from zlib_ng import zlib_ng

    from schemas.layers import quantize_int8, quantize_int8_indices

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    floats = layer_values(args.tokens)
    rows = len(floats)
    q, _ = quantize_int8(floats)
    indices, _ = quantize_int8_indices(floats)
    results = [
        ("quantize_int8 (reference)", cpu_us_per_row(lambda: quantize_int8(floats), rows,
                                                     args.repeat), None),
        ("quantize_int8_indices (compiled)",
         cpu_us_per_row(lambda: quantize_int8_indices(floats, indices), rows, args.repeat),
         None),
    ]
    results += pyarrow_rows(q, args.repeat)
    results += our_rows(indices, args.repeat)
    stored = bytes(indices[: min(rows, 4000)])
    sample = len(stored) // floats.shape[1]
    results.append(("crc32 (zlib-ng) of 1,024 bytes",
                    cpu_us_per_row(lambda: zlib_ng.crc32(stored), sample, args.repeat * 20),
                    None))
    results.append(("sha256 (hashlib) of 1,024 bytes",
                    cpu_us_per_row(lambda: hashlib.sha256(stored).digest(), sample,
                                   args.repeat * 5), None))
    print(f"{rows:,} rows of 1,024 int8 values (layers 1-2 of the wide near-free model), "
          f"one thread, CPU per row (median of {args.repeat})")
    print("| way | us per row | bytes per row |\n|---|---|---|")
    for name, us, size in results:
        print(f"| {name} | {us:.2f} | {'' if size is None else f'{size:,.0f}'} |")
    print(f"GIL: two encodes on two threads ran {gil_ratio(indices):.2f}x faster (wall) than "
          "one after the other")


if __name__ == "__main__":
    main()
