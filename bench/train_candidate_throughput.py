"""Embedding throughput of candidate biLM configs with random weights (pick before training).

    .venv/bin/python bench/train_candidate_throughput.py --threads 1 --tokens 20000

Counts real tokens only (no <S>/</S>), stateless mode, token cache on (cold at start).
"""

from __future__ import annotations

import argparse
import glob
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--corpus", default="../shared/corpora/*.txt")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--configs", default="1024x128x256,1024x128x512,1536x128x512,2048x128x512")
    args = parser.parse_args()

    import torch

    from elmo_model import BiLM, BiLMConfig, ElmoEmbedder
    from elmo_model.tokenizers import get_tokenizer

    words = get_tokenizer("elmo-store-words")  # what the default model was trained on

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sentences: list[list[str]] = []
    n = 0
    files = sorted(glob.glob(args.corpus))
    # a slice from each file so the mix of sentence lengths resembles the corpus
    per_file = args.tokens // max(len(files), 1)
    for path in files:
        got = 0
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                tokens = [token.text for token in words.tokenize(line)]
                if tokens and got < per_file:
                    sentences.append(tokens)
                    got += len(tokens)
        n += got
    filter_sets = {
        256: ((1, 16), (2, 16), (3, 32), (4, 64), (5, 128)),
        512: ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256)),
    }
    for spec in args.configs.split(","):
        d, p, f = (int(x) for x in spec.split("x"))
        config = BiLMConfig(lstm_dim=d, projection_dim=p, filters=filter_sets[f], n_highway=1)
        model = BiLM(config).eval()
        params = sum(t.numel() for t in model.parameters())
        embedder = ElmoEmbedder(model, device="cpu", dtype=args.dtype)
        embedder.embed(sentences[:20])
        embedder.cache = type(embedder.cache)(100_000)  # cold cache for the timed pass
        start = time.perf_counter()
        embedder.embed(sentences)
        elapsed = time.perf_counter() - start
        print(f"D={d} P={p} F={f} params={params / 1e6:.2f}M fp16={params * 2 / 1e6:.1f}MB "
              f"flops/tok={config.forward_flops_per_token() / 1e6:.1f}M "
              f"{args.dtype} threads={args.threads}: {n / elapsed:,.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
