"""``elmo embed``: corpus glob -> partitioned Parquet of every biLM layer (issue 3).

Imports nothing heavy at module level; the handler imports the pipeline.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

EPILOG = """\
examples:
  elmo embed 'corpus/*.txt' --out data/ds --model models/default
  elmo embed 'corpus/*.jsonl' --out data/ds --options options.json --weights weights.hdf5
  elmo embed 's3://bucket/corpus/**/*.parquet' --out s3://bucket/ds --shards 64 --actors 4
  elmo embed 'books/*.txt' --doc-per file --out data/books --dtype float32
  elmo embed 'tok/*.txt' --pretokenized --out data/tok --executor ray --actors 2
  elmo embed 'corpus/*.txt' --out data/ds --device cpu --compute-dtype bfloat16
  elmo embed 'corpus/*.txt' --out data/ds --device cuda --compute-dtype float16

Compute dtype: bfloat16 runs 1.6-3.4x faster than float32 on CPUs with bf16 matmul
support (AVX512-BF16/AMX; bench/bilm_throughput.py), vectors within cosine 0.99999 of
float32's; float16 compute is CUDA only. It is recorded in the descriptor's "extra" and
in each shard's manifest entry, and a rerun with another compute dtype is not refused.

Output: hive-partitioned Parquet under --out (tokens/, sentences/, documents/, errors/,
shard=K/), float16 layers by default (zstd; snappy for layers 1..L, which zstd hardly
shrinks but slows to read; see docs/dataset_format.md). Re-running the same command
after a crash finishes only the shards that were not committed.
Exit status: 0 when anything was stored, 1 when nothing could be processed, 2 on misuse.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "embed",
        help="embed a corpus into partitioned Parquet (every layer of every token)",
        description="Embed every token of a corpus with the biLM and store all layers as "
                    "hive-partitioned Parquet, exactly once and resumable.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sources", nargs="+", metavar="SOURCE_GLOB",
                   help="file, directory or glob of any fsspec URI (file://, s3://, gs://, ...)")
    p.add_argument("--out", required=True, metavar="URI", help="dataset URI to write into")
    model = p.add_argument_group("model (default: the bundled models/default)")
    model.add_argument("--model", metavar="DIR", help="directory with options.json + weights")
    model.add_argument("--options", metavar="FILE", help="bilm-tf options.json")
    model.add_argument("--weights", metavar="FILE", help="weights .hdf5 or .safetensors")
    p.add_argument("--shards", type=int, default=8, help="number of shards (default 8)")
    p.add_argument("--actors", type=int, default=1,
                   help="Ray actors each holding a model (default 1)")
    p.add_argument("--executor", choices=("auto", "local", "ray"), default="auto",
                   help="auto (default): Ray when --actors > 1, a GPU or --ray-address; "
                        "else in-process")
    p.add_argument("--ray-address", metavar="ADDR", help="existing Ray cluster to run on")
    p.add_argument("--dtype", choices=("float16", "float32"), default="float16",
                   help="storage dtype of the layers (default float16)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the model runs: auto (default: CUDA when the process or Ray "
                        "actor has a GPU, else CPU), cpu (no GPU is requested from Ray), "
                        "or cuda (each Ray actor requests one GPU)")
    p.add_argument("--compute-dtype", choices=("float32", "bfloat16", "float16"),
                   default="float32",
                   help="model arithmetic (default float32); bfloat16 is faster on CPUs with "
                        "bf16 matmuls, float16 needs --device cuda/auto on a GPU")
    p.add_argument("--batch-tokens", type=int, default=4096,
                   help="token budget of one model batch (default 4096)")
    p.add_argument("--format", choices=("auto", "text", "jsonl", "parquet"), default="auto",
                   help="input format (default: by extension, else text)")
    p.add_argument("--doc-per", choices=("line", "file"), default="line",
                   help="text input: one document per line (default) or per file")
    p.add_argument("--pretokenized", action="store_true",
                   help="input is already tokenized (whitespace-separated / 'tokens' lists)")
    p.add_argument("--text-column", default="text", help="JSONL/Parquet text field")
    p.add_argument("--id-column", default="id", help="JSONL/Parquet document id field")
    p.add_argument("--max-sentence-tokens", type=int, default=256,
                   help="longer sentences go through the model in windows (default 256)")
    p.add_argument("--window-overlap", type=int, default=32,
                   help="tokens shared by consecutive windows (default 32)")
    p.add_argument("--part", default="main", help="name of this part of the dataset")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.embed import EmbedConfig, ModelSpec, embed_corpus
    from pipeline.sources import ReadOptions

    cfg = EmbedConfig(
        sources=list(args.sources),
        out=args.out,
        model=ModelSpec.resolve(args.model, args.options, args.weights),
        n_shards=args.shards,
        actors=args.actors,
        dtype=args.dtype,
        batch_tokens=args.batch_tokens,
        executor=args.executor,
        ray_address=args.ray_address,
        max_sentence_tokens=args.max_sentence_tokens,
        window_overlap=args.window_overlap,
        read=ReadOptions(format=args.format, doc_per=args.doc_per,
                         pretokenized=args.pretokenized, text_column=args.text_column,
                         id_column=args.id_column),
        part=args.part,
        progress=not args.no_progress,
        device=args.device,
        compute_dtype=args.compute_dtype,
    )
    summary = embed_corpus(cfg)
    for line in summary.lines():
        print(line, file=sys.stderr)
    return 0 if summary.totals.get("documents", 0) > 0 else 1
