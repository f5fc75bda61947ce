"""biLM inference throughput: CPU step, fp32 vs bf16, token cache on/off, 1 and 2 threads,
in one run.

    .venv/bin/python bench/bilm_throughput.py                 # standard ELMo config
    .venv/bin/python bench/bilm_throughput.py --config small --batches 5

Random weights (speed does not depend on their values). Sentences are running text from
../shared/corpora, taken in order. Configurations are interleaved round-robin so that
load from other processes hits them alike; medians and ratios are what to quote.

Reported per thread count: tokens/s per variant (``torch step``: ``lstm_impl="torch"``,
the in-place torch step; the others run ``auto``, the oneDNN step); the machine's
matmul GFLOP/s for the shapes the model multiplies, as torch ``matmul`` runs them (fp32,
bf16) and as oneDNN runs them on weights reordered once (fp32), the faster of the two
here; the model's effective GFLOP/s (forward FLOPs per token from the config x tokens/s)
as a fraction of each fp32 rate; cosine of bf16 to fp32 vectors per token and layer.

With ``--device cuda`` (one run, on a GPU machine):

    .venv/bin/python bench/bilm_throughput.py --device cuda

measures the model's compute (char CNN + both LSTM stacks, synchronized, no host copy)
for fp32/bf16/fp16 and 4k/32k/131k-token batches, for each LSTM step (``torch``: the
in-place torch step; ``fused-packed``: the fused Triton step over the packed batch;
``fused``: fused, with CUDA graphs where the batch pads well, the ``auto`` choice), with
TFLOP/s, the fraction of
the plain GEMM rate for the model's own shapes, the cuDNN ``nn.LSTM`` anchor (same cell and
projection sizes, no clipping, LSTM alone), cosines of bf16/fp16 to fp32 per token and
layer, and the largest fp32 difference between CUDA and the CPU. Batches are cut from
length-sorted running text, as the stateless embedder cuts them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from workload import CONFIGS, CORPORA, running_text

from elmo_model import BiLM, BiLMConfig, ElmoEmbedder, PackPlan
from elmo_model.char_ids import BOS_TOKEN, EOS_TOKEN, token_char_ids
from elmo_model.lstm_steps import choose_step
from elmo_model.model import LstmStep


def matmul_seconds_per_flop(
    shapes: list[tuple[tuple[int, ...], tuple[int, ...], float]], dtype: torch.dtype,
    onednn: bool = False,
) -> float:
    """One timing of the FLOP-weighted seconds per FLOP over (a_shape, b_shape, share):
    torch ``matmul``, or with ``onednn`` oneDNN on weights reordered once (one
    ``PackedLinear`` per direction, as the model's oneDNN step calls them)."""
    from elmo_model.steps.onednn import PackedLinear

    total = 0.0
    for a_shape, b_shape, share in shapes:
        a, b = torch.randn(a_shape, dtype=dtype), torch.randn(b_shape, dtype=dtype)
        if not onednn:
            pairs = [(a, lambda x, b=b: torch.matmul(x, b))]
        elif a.dim() == 2:
            pairs = [(a, PackedLinear(b, None, dtype, a_shape[0]))]
        else:
            pairs = [(a[k], PackedLinear(b[k], None, dtype, a_shape[1]))
                     for k in range(a.shape[0])]
        for x, multiply in pairs:  # warm: allocation, kernel selection
            multiply(x)
        start = time.perf_counter()
        for x, multiply in pairs:
            multiply(x)
        total += share * (time.perf_counter() - start) / (2 * a.numel() * b_shape[-1])
    return total


def onednn_gemm_seconds(config: BiLMConfig, lengths: list[int]) -> float:
    """Seconds for exactly the matmuls the oneDNN step runs on one batch, alone: the char
    CNN's highway and projection in 64-token chunks, each layer's and direction's input
    projection, and its recurrent and output projections at each step's real row count
    (which falls as sentences end). What the model spends beyond this is everything else:
    convolutions, the cell's pointwise work, copies."""
    from elmo_model.steps.onednn import PackedLinear

    p, d, f = config.projection_dim, config.lstm_dim, config.n_filters
    plan = PackPlan.build(np.array(lengths))
    chunks = -(-plan.n_tokens // 64)
    calls = [(PackedLinear(torch.randn(f, 2 * f) / 50, rows=64), 64,
              chunks * config.n_highway),
             (PackedLinear(torch.randn(f, p) / 50, rows=64), 64, chunks),
             (PackedLinear(torch.randn(p, 4 * d) / 30, rows=1024), plan.n_tokens,
              2 * config.n_layers)]
    w_rec = PackedLinear(torch.randn(p, 4 * d) / 30)
    w_proj = PackedLinear(torch.randn(d, p) / 60)
    inputs = {rows: torch.randn(rows, max(f, d)) for rows in {64, plan.n_tokens,
                                                              *plan.batch_sizes}}
    for linear, rows, _ in calls:  # warm
        linear(inputs[rows][:, : linear.in_features].contiguous())
    start = time.perf_counter()
    for linear, rows, repeats in calls:
        x = inputs[rows][:, : linear.in_features].contiguous()
        for _ in range(repeats):
            linear(x)
    for _ in range(2 * config.n_layers):
        for n in plan.batch_sizes:
            w_rec(inputs[n][:, :p].contiguous())
            w_proj(inputs[n][:, :d].contiguous())
    return time.perf_counter() - start


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
    parser.add_argument("--device", default="cpu", help="cpu, or cuda[:N] for the GPU run")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (cpu)")
    parser.add_argument("--batches", type=int, default=5, help="timed batches per variant")
    parser.add_argument("--threads", default="1,2", help="torch threads to measure (cpu)")
    parser.add_argument("--batch-tokens", default="4096,32768,131072",
                        help="tokens per batch to measure (cuda)")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16", help="(cuda)")
    args = parser.parse_args()
    if args.device != "cpu":
        cuda_main(args)
        return

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
        "fp32 torch step": dict(dtype="float32", cache_size=0, lstm_impl="torch"),
        "fp32": dict(dtype="float32", cache_size=0),
        "fp32+cache": dict(dtype="float32", cache_size=200_000),
        "bf16 torch step": dict(dtype="bfloat16", cache_size=0, lstm_impl="torch"),
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
        print(f"\nthreads={threads}: the fp32 step is {embedders['fp32'].lstm_step}")
        for embedder in embedders.values():
            if embedder.cache is not None:
                with torch.inference_mode(), embedder.autocast():
                    for i in range(0, len(history), 256):
                        embedder.cache.lookup(
                            model, [t for s in history[i : i + 256] for t in s], embedder.device,
                            embedder.step,
                        )
        for embedder in embedders.values():  # one untimed batch each: allocator, kernels
            embedder.embed(batches[0][:4])
        times: dict[str, list[float]] = {name: [] for name in variants}
        outputs: dict[str, list[np.ndarray]] = {name: [] for name in variants}
        shapes = model_matmul_shapes(config, args.batch_size, int(statistics.mean(n_tokens)))
        matmul: dict[torch.dtype, list[float]] = {torch.float32: [], torch.bfloat16: []}
        onednn: list[float] = []
        gemm_share: list[float] = []
        for batch in batches:
            for name, embedder in embedders.items():  # interleaved: same load for all
                start = time.perf_counter()
                out = embedder.embed(batch)
                times[name].append(time.perf_counter() - start)
                outputs[name].extend(out)
            for dtype, samples in matmul.items():  # the matmul rate under the same load
                samples.append(matmul_seconds_per_flop(shapes, dtype))
            onednn.append(matmul_seconds_per_flop(shapes, torch.float32, onednn=True))
            gemm_share.append(onednn_gemm_seconds(config, [len(s) + 2 for s in batch])
                              / times["fp32"][-1])
        fp32_rate = 1e-9 / statistics.median(matmul[torch.float32])
        bf16_rate = 1e-9 / statistics.median(matmul[torch.bfloat16])
        onednn_rate = 1e-9 / statistics.median(onednn)
        rate = {
            name: statistics.median(n / t for n, t in zip(n_tokens, ts, strict=True))
            for name, ts in times.items()
        }
        cos = cosines(outputs["fp32"], outputs["bf16+cache"])
        step_diff = max(float(np.abs(a - b).max())
                        for a, b in zip(outputs["fp32"], outputs["fp32 torch step"], strict=True))
        effective = rate["fp32"] * flops_per_token / 1e9
        rows.append((threads, rate, fp32_rate, bf16_rate, onednn_rate, effective, cos))
        for name, value in rate.items():
            print(f"  {name:<15} {value:8.0f} tokens/s  ({value / rate['fp32']:.2f}x fp32)")
        print(
            f"  matmul rate for the model's shapes: fp32 {fp32_rate:.1f} GFLOP/s (torch), "
            f"{onednn_rate:.1f} (oneDNN, reordered weights); bf16 {bf16_rate:.1f} (torch)"
        )
        print(
            f"  effective fp32 model rate {effective:.1f} GFLOP/s = "
            f"{effective / fp32_rate:.2f} of the torch fp32 matmul rate, "
            f"{effective / onednn_rate:.2f} of the oneDNN one; the torch step ran "
            f"{rate['fp32 torch step'] * flops_per_token / 1e9 / fp32_rate:.2f} of torch's"
        )
        print(f"  fp32 oneDNN step vs torch step: largest difference {step_diff:.1e}")
        print(f"  the oneDNN step's own matmuls, timed alone at this batch's exact shapes: "
              f"{statistics.median(gemm_share):.2f} of the fp32 model's time")
        print(
            f"  cosine bf16+cache vs fp32 per token and layer: min {cos.min():.5f}, "
            f"p01 {np.quantile(cos, 0.01):.5f}, mean {cos.mean():.5f}"
        )

    print(
        "\n| threads | fp32 torch step tok/s | fp32 | fp32 vs torch step | fp32+cache | "
        "bf16 torch step | bf16 | bf16+cache | cache alone | bf16+cache vs fp32 | "
        "fp32 matmul GFLOP/s torch / oneDNN | bf16 matmul (torch) | effective fp32 GFLOP/s "
        "(of torch; of oneDNN) | min cosine |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for threads, rate, fp32_rate, bf16_rate, onednn_rate, effective, cos in rows:
        print(
            f"| {threads} | {rate['fp32 torch step']:.0f} | {rate['fp32']:.0f} | "
            f"{rate['fp32'] / rate['fp32 torch step']:.2f}x | {rate['fp32+cache']:.0f} | "
            f"{rate['bf16 torch step']:.0f} | {rate['bf16']:.0f} | {rate['bf16+cache']:.0f} | "
            f"{rate['fp32+cache'] / rate['fp32']:.2f}x | {rate['bf16+cache'] / rate['fp32']:.2f}x "
            f"| {fp32_rate:.1f} / {onednn_rate:.1f} | {bf16_rate:.1f} | {effective:.1f} "
            f"({effective / fp32_rate:.2f}; {effective / onednn_rate:.2f}) | {cos.min():.4f} |"
        )


# ---- CUDA -----------------------------------------------------------------------------

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Each a fresh step per variant, so one variant's CUDA graphs and buffers go with it.
CUDA_STEPS = {
    "torch": lambda device: choose_step("torch", device).step,
    "fused-packed": lambda device: _fused(graphs=False),
    "fused": lambda device: choose_step("fused", device).step,
}


def _fused(graphs: bool) -> LstmStep:
    from elmo_model.steps.fused_graphs import FusedStep  # imports triton

    return FusedStep(graphs=graphs)


def text_pool(n_tokens: int) -> list[list[str]]:
    """Running text of at least ``n_tokens`` tokens: the corpora when they are beside the
    checkout, else made-up words in sentences of 8-40 (speed does not depend on words)."""
    if CORPORA.exists():
        pool = running_text(10**6, skip=0)
        if sum(len(s) for s in pool) >= n_tokens:
            return pool
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(1, 12)))
             for _ in range(20_000)]
    pool, total = [], 0
    while total < n_tokens:
        sentence = [words[i] for i in rng.integers(0, len(words), rng.integers(8, 41))]
        pool.append(sentence)
        total += len(sentence)
    return pool


def length_sorted_batches(pool: list[list[str]], batch_tokens: int, n_batches: int):
    """Cut ``n_batches`` batches of ~``batch_tokens`` tokens (boundaries included) from
    the length-sorted pool, spread over the length range."""
    ordered = sorted(pool, key=len)
    batches, current, budget = [], [], 0
    for sentence in ordered:
        current.append(sentence)
        budget += len(sentence) + 2
        if budget >= batch_tokens:
            batches.append(current)
            current, budget = [], 0
    if len(batches) > n_batches:
        picks = np.linspace(0, len(batches) - 1, n_batches).round().astype(int)
        batches = [batches[i] for i in picks]
    return batches


class DeviceBatch:
    """A batch's char ids and pack plan on the device, made once (not timed)."""

    def __init__(self, model: BiLM, sentences: list[list[str]], device: torch.device) -> None:
        max_chars = model.config.max_chars
        flat = [t for s in sentences for t in (BOS_TOKEN, *s, EOS_TOKEN)]
        ids = np.stack([token_char_ids(t, max_chars) for t in flat])
        self.char_ids = torch.from_numpy(ids).to(device)
        self.plan = PackPlan.build(np.array([len(s) + 2 for s in sentences]), device)
        self.n_tokens = self.plan.n_tokens
        self.n_sentences = len(sentences)


def run_model(model: BiLM, batch: DeviceBatch, dtype: torch.dtype,
              step: LstmStep) -> torch.Tensor:
    """All layers ``[L + 1, N, 2P]`` float32: what the embedder computes, minus the copy
    to the host."""
    device_type = batch.char_ids.device.type
    with torch.inference_mode(), torch.autocast(device_type, dtype=dtype,
                                                enabled=dtype != torch.float32):
        tokens = model.token_embedding(batch.char_ids, step).float()
        layers, _ = model.contextualize(tokens, batch.plan, step=step)
        return torch.cat([tokens.repeat(1, 2).unsqueeze(0), layers.float()])


def cuda_seconds(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def cuda_gemm_rate(config: BiLMConfig, batch: int, tokens: int, dtype: torch.dtype,
                   device: torch.device) -> float:
    """FLOP/s of plain matmuls of the model's shapes (FLOP-weighted), median of 5."""
    seconds_per_flop = 0.0
    for a_shape, b_shape, share in model_matmul_shapes(config, batch, tokens):
        a = torch.randn(a_shape, dtype=dtype, device=device)
        b = torch.randn(b_shape, dtype=dtype, device=device)
        torch.matmul(a, b)
        flops = 2 * a.numel() * b_shape[-1]
        seconds = statistics.median(cuda_seconds(lambda a=a, b=b: torch.matmul(a, b), 5))
        seconds_per_flop += share * seconds / flops
    return 1 / seconds_per_flop


def cudnn_anchor(config: BiLMConfig, batch: int, steps: int, dtype: torch.dtype,
                 device: torch.device) -> float:
    """tokens/s of ``nn.LSTM`` (cuDNN) over both directions' work for ``batch`` sentences
    of ``steps`` tokens: the same cells and projection, no clipping, LSTM alone."""
    lstm = torch.nn.LSTM(config.projection_dim, config.lstm_dim, num_layers=config.n_layers,
                         proj_size=config.projection_dim).to(device, dtype).eval()
    # Forward and backward stacks: same FLOPs as one stack over twice the sentences.
    x = torch.randn(steps, 2 * batch, config.projection_dim, device=device, dtype=dtype)
    with torch.inference_mode():
        lstm(x)
        seconds = statistics.median(cuda_seconds(lambda: lstm(x), 5))
    return batch * steps / seconds


def lstm_flops_per_token(config: BiLMConfig) -> int:
    p, d = config.projection_dim, config.lstm_dim
    return 2 * config.n_layers * (2 * (p + p) * 4 * d + 2 * d * p)


def measure(model: BiLM, batches: list[DeviceBatch], dtype: torch.dtype, step: LstmStep):
    """Median tokens/s over the batches (each the median of 3 timings, after one warm-up
    call that compiles kernels and captures graphs), and the first two batches' vectors."""
    for batch in batches:
        run_model(model, batch, dtype, step)
    rates = []
    for batch in batches:
        seconds = cuda_seconds(lambda batch=batch: run_model(model, batch, dtype, step), 3)
        rates.append(batch.n_tokens / statistics.median(seconds))
    vectors = [run_model(model, batch, dtype, step) for batch in batches[:2]]
    return statistics.median(rates), vectors


def cuda_main(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    if not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: no CUDA GPU is visible")
    config = CONFIGS[args.config]
    torch.manual_seed(0)
    model = BiLM(config).to(device).eval()
    auto = choose_step("auto", device)
    print(f"device {torch.cuda.get_device_name(device)}; torch {torch.__version__}; "
          f"auto LSTM step: {auto.name} ({auto.reason})")
    flops_per_token = config.forward_flops_per_token()
    sizes = [int(t) for t in args.batch_tokens.split(",")]
    dtypes = [_DTYPES[name] for name in args.dtypes.split(",")]
    pool = text_pool(max(sizes) * (args.batches + 2))

    # CUDA fp32 against the CPU's reference step, on a small batch.
    cpu_model = BiLM(config).eval()
    cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    small = pool[:16]
    want = run_model(cpu_model, DeviceBatch(cpu_model, small, torch.device("cpu")),
                     torch.float32, choose_step("reference", "cpu").step)
    got = run_model(model, DeviceBatch(model, small, device), torch.float32, auto.step).cpu()
    print(f"CUDA fp32 ({auto.name}) vs CPU fp32 reference: max abs difference "
          f"{(got - want).abs().max():.2e}")

    rows = []
    for size in sizes:
        batches = [DeviceBatch(model, b, device)
                   for b in length_sorted_batches(pool, size, args.batches)]
        tokens = [b.n_tokens for b in batches]
        mean_batch = int(statistics.mean(b.n_sentences for b in batches))
        mean_steps = round(statistics.mean(b.n_tokens / b.n_sentences for b in batches))
        fp32_vectors: list[torch.Tensor] = []  # the torch step's, first two batches
        for dtype in dtypes:
            gemm = cuda_gemm_rate(config, mean_batch, int(statistics.mean(tokens)), dtype, device)
            anchor = cudnn_anchor(config, mean_batch, mean_steps, dtype, device)
            for impl_name, make_step in CUDA_STEPS.items():
                rate, vectors = measure(model, batches, dtype, make_step(device))
                torch.cuda.empty_cache()  # the step's graphs and padded buffers are gone
                if dtype == torch.float32 and impl_name == "torch":
                    fp32_vectors = vectors
                cosine = min((float(F.cosine_similarity(a, b, dim=-1).min())
                              for a, b in zip(vectors, fp32_vectors, strict=False)),
                             default=float("nan"))
                tflops = rate * flops_per_token / 1e12
                rows.append((str(dtype).removeprefix("torch."), size, impl_name, rate, tflops,
                             tflops * 1e12 / gemm, anchor, anchor * lstm_flops_per_token(config)
                             / 1e12, cosine))
                print(f"{rows[-1][0]:>8} {size:>7} {impl_name:<14} {rate:>10.0f} tok/s "
                      f"{tflops:6.1f} TFLOP/s ({tflops * 1e12 / gemm:.2f} of GEMM "
                      f"{gemm / 1e12:.0f}); cuDNN anchor {anchor:.0f} tok/s; "
                      f"cosine to fp32 torch step {cosine:.6f}", flush=True)
        del batches

    print("\n| compute | batch tokens | LSTM step | tok/s | TFLOP/s | of GEMM rate | cuDNN "
          "nn.LSTM tok/s (LSTM TFLOP/s) | min cosine to fp32 |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype, size, impl_name, rate, tflops, fraction, anchor, anchor_tflops, cosine in rows:
        print(f"| {dtype} | {size} | {impl_name} | {rate:.0f} | {tflops:.1f} | {fraction:.2f} | "
              f"{anchor:.0f} ({anchor_tflops:.0f}) | {cosine:.6f} |")


if __name__ == "__main__":
    main()
