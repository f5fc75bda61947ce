"""Same bytes whatever the batch (issue 50): does a sentence's stored int8 layer depend on
which sentences shared its batch? And which products' rows depend on the row count?

    .venv/bin/python bench/same_bytes_any_batch.py --threads 1
    .venv/bin/python bench/same_bytes_any_batch.py --threads 3 --sentences 250 --products

Sentences are cut from data/sample/austen.txt at lengths 3 + Exp(mean 25), so a batch's
longest sentence often stands alone at its length (its last steps run on one row). The
default model embeds them (``embed_int8``) in one call, and again in two calls, reversed,
in 1,000-token batches, without the token cache and (the first 80) each alone; per
grouping: the tokens whose stored bytes differ from the one-call run. ``--products``: for
the default model's product shapes, the row counts at which a row of the product differs
from the same row in a 4,000-row product (MKL through torch, oneDNN on a reordered weight).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
import torch

from elmo_model.api import default_model_dir, load_model_dir
from elmo_model.embedder import TokenCache

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "austen.txt"
ROW_COUNTS = [*range(1, 70), 96, 127, 128, 129, 200, 256, 500, 979, 1024, 1500, 4000]


def sentences(count: int) -> list[list[str]]:
    words, rng, out, at = SAMPLE.read_text().split(), random.Random(0), [], 0
    while at < len(words) and len(out) < count:
        n = int(min(300, 3 + rng.expovariate(1 / 25)))
        out.append(words[at : at + n])
        at += n
    return out


def differing(a: list, b: list) -> str:
    """Tokens whose values or scale differ, values differing, scales differing (max ulp)."""
    tokens = values = scales = ulp = 0
    for (va, sa), (vb, sb) in zip(a, b, strict=True):
        scale_differs = sa != sb
        values += int((va != vb).sum())
        scales += int(scale_differs.sum())
        tokens += int((scale_differs | (va != vb).any(-1)).sum())
        if scale_differs.any():
            gap = np.abs(sa.view(np.int32).astype(np.int64) - sb.view(np.int32))
            ulp = max(ulp, int(gap.max()))
    return f"{tokens} tokens differ ({values} values, {scales} scales, max {ulp} ulp)"


def groupings(count: int) -> None:
    embedder = load_model_dir(default_model_dir())
    cut = sentences(count)
    print(f"{len(cut)} sentences, {sum(map(len, cut))} tokens, {torch.get_num_threads()} "
          f"thread(s), step {embedder.lstm_step[0]}")

    def stored(group: list[list[str]]) -> list:
        layers = embedder.embed_int8(group)
        return [layers.sentence(i) for i in range(len(group))]

    want = stored(cut)
    half = len(cut) // 2
    print("two calls:", differing(want, stored(cut[:half]) + stored(cut[half:])))
    print("reversed:", differing(want, stored(cut[::-1])[::-1]))
    embedder.max_batch_tokens = 1000
    print("1,000-token batches:", differing(want, stored(cut)))
    embedder.max_batch_tokens, embedder.cache = 4096, None
    print("no token cache:", differing(want, stored(cut)))
    embedder.cache = TokenCache(100_000)
    print("each alone (first 80):", differing(want[:80], [stored([s])[0] for s in cut[:80]]))


def products() -> None:
    from elmo_model.steps.onednn import PackedLinear

    torch.manual_seed(0)
    top = max(ROW_COUNTS)
    for k, n in [(128, 4096), (1024, 128)]:  # input and recurrent; output projection
        weight, x = torch.randn(k, n) * 0.05, torch.randn(top, k)
        packed = PackedLinear(weight, None)
        for name, product in [("MKL", lambda m, w=weight, x=x: torch.mm(x[:m], w)),
                              ("oneDNN", lambda m, p=packed, x=x: p(x[:m]))]:
            full = product(top)
            bad = [m for m in ROW_COUNTS if not torch.equal(product(m), full[:m])]
            print(f"{name} [M x {k}] x [{k} x {n}]: rows differ at M = {bad or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=600)
    parser.add_argument("--products", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.products:
        products()
    groupings(args.sentences)


if __name__ == "__main__":
    main()
