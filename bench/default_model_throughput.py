"""Embedding throughput of models side by side: ``ElmoEmbedder`` as ``elmo embed`` runs it
(stateless, token cache on and cold at the start of the timed pass, 4,096-token batches),
fp32 and bf16, 1 and 2 torch threads. The one embedding-throughput measurement of the
bench suite: ``train_default_eval.py`` times a packaged model with ``tokens_per_second``.

    .venv/bin/python bench/default_model_throughput.py models/default /tmp/old-default
    .venv/bin/python bench/default_model_throughput.py 1024x128x256 1536x128x512 --threads 1

A MODEL is a model directory (its weights; the sentences of the bundled sample,
``data/sample``, cut by the model's own tokenizer) or a candidate shape ``DxPxF`` to pick
before training (``D`` LSTM cells, ``P`` projection, ``F`` 256 or 512 char filters, one
highway layer, random weights; the sample cut by ``elmo-store-words``, what the default
model was trained on). Variants are interleaved round-robin and repeated, so load from
other processes hits them alike; the medians are what to quote.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

import torch

import elmo_model
from elmo_model.tokenizers import get_tokenizer, model_tokenizer

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"
CANDIDATE = re.compile(r"(\d+)x(\d+)x(256|512)\Z")
CANDIDATE_TOKENIZER = "elmo-store-words"
FILTER_SETS = {
    256: ((1, 16), (2, 16), (3, 32), (4, 64), (5, 128)),
    512: ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256)),
}


def sample_sentences(tokenizer_name: str) -> list[list[str]]:
    tokenizer = get_tokenizer(tokenizer_name)
    sentences = []
    for path in sorted(SAMPLE.glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            sentences.extend(s.words for s in tokenizer.split_sentences(line) if s.words)
    return sentences


def embedder_for(model: str, dtype: str) -> elmo_model.ElmoEmbedder:
    """``model``'s embedder on the CPU, its token cache cold."""
    shape = CANDIDATE.match(model)
    if shape is None:
        return elmo_model.load(model, dtype=dtype, device="cpu")
    cells, projection, filters = (int(x) for x in shape.groups())
    torch.manual_seed(0)
    config = elmo_model.BiLMConfig(lstm_dim=cells, projection_dim=projection,
                                   filters=FILTER_SETS[filters], n_highway=1)
    return elmo_model.ElmoEmbedder(elmo_model.BiLM(config).eval(), device="cpu", dtype=dtype)


def tokens_per_second(embedder: elmo_model.ElmoEmbedder, sentences: list[list[str]]) -> float:
    """Real tokens a second over one pass of ``sentences``, after a short warm-up (the
    allocator, the kernels) and with the token cache emptied, as a fresh run starts."""
    embedder.embed(sentences[:10])
    embedder.cache = type(embedder.cache)(100_000)
    began = time.perf_counter()
    embedder.embed(sentences)
    return sum(map(len, sentences)) / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="a model directory, or a candidate shape DxPxF")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=2000,
                        help="the first N sentences of the sample")
    args = parser.parse_args()
    texts = {m: sample_sentences(CANDIDATE_TOKENIZER if CANDIDATE.match(m)
                                 else model_tokenizer(m))[: args.sentences]
             for m in args.models}
    variants = [(m, d, int(t)) for t in args.threads.split(",")
                for d in args.dtypes.split(",") for m in args.models]
    rates: dict[tuple[str, str, int], list[float]] = {v: [] for v in variants}
    for _ in range(args.repeat):
        for model, dtype, threads in variants:
            torch.set_num_threads(threads)
            rates[(model, dtype, threads)].append(
                tokens_per_second(embedder_for(model, dtype), texts[model]))
    for model in args.models:
        print(f"{model}: {sum(map(len, texts[model])):,} tokens in {len(texts[model]):,} "
              "sentences")
        if CANDIDATE.match(model):
            bilm = embedder_for(model, "float32").model
            params = sum(t.numel() for t in bilm.parameters())
            print(f"  {params / 1e6:.2f}M parameters, "
                  f"{bilm.config.forward_flops_per_token() / 1e6:.1f} MFLOP/token")
    for (model, dtype, threads), values in rates.items():
        print(f"  {model:30s} {dtype:9s} {threads} thread(s): "
              f"median {statistics.median(values):8,.0f} tok/s  "
              f"(runs: {', '.join(f'{v:,.0f}' for v in values)})")


if __name__ == "__main__":
    main()
