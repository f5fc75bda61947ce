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
  elmo embed 'books/*.txt' --doc-per file --out data/books --dtype float32
  elmo embed 'tok/*.txt' --pretokenized --out data/tok --executor ray --actors 2
  elmo embed 'corpus/*.txt' --out data/ds --tokenizer elmo-store-ptb
  elmo embed 'corpus/*.txt' --out data/ds --device cpu --compute-dtype bfloat16
  on a Ray cluster (see ray_cluster.yaml and docs/jobs.md), from the head node:
  elmo embed 's3://bucket/corpus/**/*.txt' --out s3://bucket/ds --ray-address auto \\
      --actors 8 --device cuda --compute-dtype float16 --wait-for-resources 600

How it runs: the driver lists the inputs and cuts them into work items (byte ranges of
about --item-tokens tokens, at least --shards of them; no text is read by the driver).
Workers (this process, or Ray actors holding the model) read, tokenize, embed and write
each item to staging; the driver commits finished items into the manifest. Only small
commit records come back to the driver, so its memory does not grow with the corpus.
Before any work the run checks that the cluster can hold the actors and that the model
loads; a run that fails before its first commit leaves --out as it found it.

Compute dtype: bfloat16 runs 1.6-3.4x faster than float32 on CPUs with bf16 matmul
support (AVX512-BF16/AMX; bench/bilm_throughput.py), vectors within cosine 0.99999 of
float32's; float16 compute is CUDA only. It is recorded in the descriptor's "extra" and
in each item's manifest entry, and a rerun with another compute dtype is not refused.

Output: hive-partitioned Parquet under --out (tokens/, sentences/, documents/, errors/,
shard=K/ where K is the work item), float16 layers by default (zstd; snappy for layers
1..L; see docs/dataset_format.md). Re-running the same command after a crash or kill
finishes only the items that were not committed, and the dataset equals an
uninterrupted run's.
Exit status: 0 when anything was stored, 1 when nothing could be processed, 2 on misuse.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "embed",
        help="embed a corpus into partitioned Parquet (every layer of every token)",
        description="Embed every token of a corpus (text, JSON Lines or Parquet, on any "
                    "fsspec file system) with the biLM and store every layer of every token "
                    "as hive-partitioned Parquet, exactly once and resumable: the product's "
                    "main job. Runs in-process, or on a Ray cluster with --actors/--ray-address.",
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
    p.add_argument("--shards", type=int, default=8,
                   help="at least this many work items (default 8), so small corpora spread "
                        "over actors; each item is one shard=K folder")
    p.add_argument("--item-tokens", type=int, default=262_144, metavar="N",
                   help="target tokens per work item, estimated from input bytes "
                        "(default 262144)")
    p.add_argument("--actors", type=int, default=1,
                   help="Ray actors each holding a model (default 1)")
    p.add_argument("--executor", choices=("auto", "local", "ray"), default="auto",
                   help="auto (default): Ray when --actors > 1, a GPU or --ray-address; "
                        "else in-process")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="existing Ray cluster to run on ('auto' on a cluster node)")
    p.add_argument("--wait-for-resources", type=float, default=0.0, metavar="SECONDS",
                   help="how long to wait for the cluster to offer the actors' CPUs/GPUs "
                        "(autoscaling clusters); default 0: fail at once, naming what is "
                        "missing")
    p.add_argument("--cpus-per-actor", type=float, metavar="N",
                   help="Ray CPUs per actor (default: the cluster's CPUs / --actors, or 1 "
                        "with a GPU)")
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
    p.add_argument("--tokenizer", metavar="NAME",
                   help="tokenizer (default: the one the model declares); one of: "
                        + ", ".join(_tokenizer_names()))
    p.add_argument("--max-sentence-tokens", type=int, default=256,
                   help="longer sentences go through the model in windows (default 256)")
    p.add_argument("--window-overlap", type=int, default=32,
                   help="tokens shared by consecutive windows (default 32)")
    p.add_argument("--part", default="main", help="name of this part of the dataset")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def _tokenizer_names() -> list[str]:
    from pipeline.tokenize import tokenizer_names

    return list(tokenizer_names())


def run(args: argparse.Namespace) -> int:
    from pipeline.embed import EmbedConfig, ModelSpec, embed_corpus
    from pipeline.sources import ReadOptions

    cfg = EmbedConfig(
        sources=list(args.sources),
        out=args.out,
        model=ModelSpec.resolve(args.model, args.options, args.weights),
        n_shards=args.shards,
        item_tokens=args.item_tokens,
        tokenizer=args.tokenizer,
        wait_for_resources_s=args.wait_for_resources,
        cpus_per_actor=args.cpus_per_actor,
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
