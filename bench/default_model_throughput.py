"""Embedding throughput of model directories side by side: ``ElmoEmbedder`` as
``elmo embed`` runs it (stateless, token cache on and cold at the start, 4,096-token
batches), fp32 and bf16, 1 and 2 torch threads, on the sentences of the bundled sample
(``data/sample``, cut by each model's own tokenizer: the same words for the bundled models).

    .venv/bin/python bench/default_model_throughput.py models/default /tmp/old-default

Variants are interleaved round-robin and repeated, so load from other processes hits them
alike; the medians are what to quote.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import elmo_model
from elmo_model.tokenizers import get_tokenizer, model_tokenizer

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"


def sample_sentences(model_dir: str) -> list[list[str]]:
    tokenizer = get_tokenizer(model_tokenizer(model_dir))
    sentences = []
    for path in sorted(SAMPLE.glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            sentences.extend(s.words for s in tokenizer.split_sentences(line) if s.words)
    return sentences


def tokens_per_second(model_dir: str, dtype: str, sentences: list[list[str]]) -> float:
    embedder = elmo_model.load(model_dir, dtype=dtype, device="cpu")  # a cold token cache
    began = time.perf_counter()
    embedder.embed(sentences)
    return sum(map(len, sentences)) / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", metavar="MODEL_DIR")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=2000,
                        help="the first N sentences of the sample")
    args = parser.parse_args()
    texts = {m: sample_sentences(m)[: args.sentences] for m in args.models}
    variants = [(m, d, int(t)) for t in args.threads.split(",")
                for d in args.dtypes.split(",") for m in args.models]
    rates: dict[tuple[str, str, int], list[float]] = {v: [] for v in variants}
    for _ in range(args.repeat):
        for model_dir, dtype, threads in variants:
            torch.set_num_threads(threads)
            rates[(model_dir, dtype, threads)].append(
                tokens_per_second(model_dir, dtype, texts[model_dir]))
    for model_dir in args.models:
        print(f"{model_dir}: {sum(map(len, texts[model_dir])):,} tokens in "
              f"{len(texts[model_dir]):,} sentences")
    for (model_dir, dtype, threads), values in rates.items():
        print(f"  {model_dir:30s} {dtype:9s} {threads} thread(s): "
              f"median {statistics.median(values):8,.0f} tok/s  "
              f"(runs: {', '.join(f'{v:,.0f}' for v in values)})")


if __name__ == "__main__":
    main()
