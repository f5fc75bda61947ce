"""biLM inference throughput: fp32 vs bf16, token cache on/off, 1 and 2 threads, in one run.

    .venv/bin/python bench/bilm_throughput.py                 # standard ELMo config
    .venv/bin/python bench/bilm_throughput.py --config small --batches 5

Random weights (speed does not depend on their values). Sentences are running text from
../shared/corpora, taken in order. Configurations are interleaved round-robin so that
load from other processes hits them alike; medians and ratios are what to quote.

Reported per thread count: tokens/s per variant; the machine's matmul GFLOP/s for the
shapes the model multiplies (fp32 and bf16); the model's effective GFLOP/s (forward
FLOPs per token from the config x tokens/s) as a fraction of the fp32 matmul rate;
cosine of bf16 to fp32 vectors per token and layer.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from elmo_model import BiLM, BiLMConfig, ElmoEmbedder

CONFIGS = {
    "standard": BiLMConfig(),
    "small": BiLMConfig(
        lstm_dim=1024,
        projection_dim=128,
        filters=((1, 32), (2, 32), (3, 64), (4, 128)),
        n_highway=1,
    ),
}
CORPORA = Path(__file__).resolve().parent.parent.parent / "shared" / "corpora"
_TOKEN = re.compile(r"\w+|[^\w\s]")


def running_text(
    n_sentences: int, skip: int, min_len: int = 8, max_len: int = 40
) -> list[list[str]]:
    """Consecutive lines of Austen and Melville, crudely tokenized, of moderate length."""
    lines = (CORPORA / "austen.txt").read_text(encoding="utf-8").splitlines()
    lines += (CORPORA / "moby_dick.txt").read_text(encoding="utf-8").splitlines()
    out: list[list[str]] = []
    for line in lines[skip:]:
        tokens = _TOKEN.findall(line)
        if min_len <= len(tokens) <= max_len:
            out.append(tokens)
        elif len(tokens) > max_len:
            out.append(tokens[:max_len])
        if len(out) == n_sentences:
            break
    return out


def matmul_seconds_per_flop(
    shapes: list[tuple[tuple[int, ...], tuple[int, ...], float]], dtype: torch.dtype
) -> float:
    """One timing of the FLOP-weighted seconds per FLOP over (a_shape, b_shape, share)."""
    total = 0.0
    for a_shape, b_shape, share in shapes:
        a, b = torch.randn(a_shape, dtype=dtype), torch.randn(b_shape, dtype=dtype)
        torch.matmul(a, b)  # warm: allocation, kernel selection
        start = time.perf_counter()
        torch.matmul(a, b)
        total += share * (time.perf_counter() - start) / (2 * a.numel() * b_shape[-1])
    return total


def model_matmul_shapes(config: BiLMConfig, batch: int, tokens: int):
    """The biLM's dominant matmuls for a batch, with their share of its FLOPs."""
    p, d, f = config.projection_dim, config.lstm_dim, config.n_filters
    parts = [
        ((2, tokens, p), (2, p, 4 * d), 2 * 2 * tokens * p * 4 * d),  # input projections
        ((2, batch, p), (2, p, 4 * d), 2 * 2 * tokens * p * 4 * d),  # recurrent, per step
        ((2, batch, d), (2, d, p), 2 * 2 * tokens * d * p),  # cell -> projection
        ((tokens, f), (f, 2 * f), config.n_highway * 2 * tokens * f * 2 * f),  # highway
    ]
    total = sum(flops for *_, flops in parts)
    return [(a, b, flops / total) for a, b, flops in parts]


def cosines(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    values = []
    for x, y in zip(a, b, strict=True):
        num = (x * y).sum(-1)
        den = np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1) + 1e-12
        values.append((num / den).ravel())
    return np.concatenate(values)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", choices=sorted(CONFIGS), default="standard")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    parser.add_argument("--batches", type=int, default=5, help="timed batches per variant")
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()

    config = CONFIGS[args.config]
    torch.manual_seed(0)
    model = BiLM(config).eval()
    sentences = running_text(args.batch_size * args.batches, skip=3000)
    batches = [
        sentences[i : i + args.batch_size] for i in range(0, len(sentences), args.batch_size)
    ]
    # Warm the cache as a long job would be: on the preceding running text.
    history = running_text(3000, skip=0)
    n_tokens = [sum(len(s) for s in b) for b in batches]
    flops_per_token = config.forward_flops_per_token()
    print(
        f"config {args.config}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
        f"{flops_per_token / 1e9:.3f} GFLOP/token; {len(batches)} batches of {args.batch_size} "
        f"sentences, {statistics.mean(n_tokens):.0f} tokens each"
    )

    variants = {
        "fp32": dict(dtype="float32", cache_size=0),
        "fp32+cache": dict(dtype="float32", cache_size=200_000),
        "bf16": dict(dtype="bfloat16", cache_size=0),
        "bf16+cache": dict(dtype="bfloat16", cache_size=200_000),
    }
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        embedders = {
            name: ElmoEmbedder(model, device="cpu", max_batch_tokens=1 << 20, **kw)
            for name, kw in variants.items()
        }
        for embedder in embedders.values():
            if embedder.cache is not None:
                with torch.inference_mode(), embedder._autocast():
                    for i in range(0, len(history), 256):
                        embedder.cache.lookup(
                            model, [t for s in history[i : i + 256] for t in s], embedder.device
                        )
        for embedder in embedders.values():  # one untimed batch each: allocator, kernels
            embedder.embed(batches[0][:4])
        times: dict[str, list[float]] = {name: [] for name in variants}
        outputs: dict[str, list[np.ndarray]] = {name: [] for name in variants}
        shapes = model_matmul_shapes(config, args.batch_size, int(statistics.mean(n_tokens)))
        matmul: dict[torch.dtype, list[float]] = {torch.float32: [], torch.bfloat16: []}
        for batch in batches:
            for name, embedder in embedders.items():  # interleaved: same load for all
                start = time.perf_counter()
                out = embedder.embed(batch)
                times[name].append(time.perf_counter() - start)
                outputs[name].extend(out)
            for dtype, samples in matmul.items():  # the matmul rate under the same load
                samples.append(matmul_seconds_per_flop(shapes, dtype))
        fp32_rate = 1e-9 / statistics.median(matmul[torch.float32])
        bf16_rate = 1e-9 / statistics.median(matmul[torch.bfloat16])
        rate = {
            name: statistics.median(n / t for n, t in zip(n_tokens, ts, strict=True))
            for name, ts in times.items()
        }
        cos = cosines(outputs["fp32"], outputs["bf16+cache"])
        effective = rate["fp32"] * flops_per_token / 1e9
        rows.append((threads, rate, fp32_rate, bf16_rate, effective, cos))
        print(f"\nthreads={threads}")
        for name, value in rate.items():
            print(f"  {name:<11} {value:8.0f} tokens/s  ({value / rate['fp32']:.2f}x fp32)")
        print(
            f"  matmul rate for the model's shapes: fp32 {fp32_rate:.1f} GFLOP/s, "
            f"bf16 {bf16_rate:.1f} GFLOP/s"
        )
        print(
            f"  effective fp32 model rate {effective:.1f} GFLOP/s = "
            f"{effective / fp32_rate:.2f} of the fp32 matmul rate"
        )
        print(
            f"  cosine bf16+cache vs fp32 per token and layer: min {cos.min():.5f}, "
            f"p01 {np.quantile(cos, 0.01):.5f}, mean {cos.mean():.5f}"
        )

    print(
        "\n| threads | fp32 tok/s | fp32+cache | bf16 | bf16+cache | cache alone | bf16+cache "
        "vs fp32 | fp32 matmul GFLOP/s | bf16 matmul GFLOP/s | effective fp32 GFLOP/s "
        "(fraction) | min cosine |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for threads, rate, fp32_rate, bf16_rate, effective, cos in rows:
        print(
            f"| {threads} | {rate['fp32']:.0f} | {rate['fp32+cache']:.0f} | {rate['bf16']:.0f} | "
            f"{rate['bf16+cache']:.0f} | {rate['fp32+cache'] / rate['fp32']:.2f}x | "
            f"{rate['bf16+cache'] / rate['fp32']:.2f}x | {fp32_rate:.1f} | {bf16_rate:.1f} | "
            f"{effective:.1f} ({effective / fp32_rate:.2f}) | {cos.min():.4f} |"
        )


if __name__ == "__main__":
    main()
