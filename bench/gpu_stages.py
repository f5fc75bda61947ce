"""Issue 36 on one GPU: the model alone vs `elmo embed` end to end, with 1 item worker per
GPU and with the node's default (`--cpu-workers`), and how busy the GPU was in each.

    python3 bench/gpu_stages.py --corpus /tmp/wiki.jsonl --model /tmp/standard \\
        --tokenizer elmo-store-sentences --compute-dtype bfloat16

"Model only" is `ElmoEmbedder.embed_int8` (quantized on the device, copied to pinned host
memory) over the corpus's sentences in units of the pipeline's size, one unit ahead, timed
on a second pass (the first compiles kernels and captures graphs); "end to end" is `elmo
embed` from the file to committed int8 Parquet, in a fresh process: its rate over the
whole wall time (Ray's start and the model's load included), and once started (less the
seconds `elmo embed` reports before its first item). The runs (``RUNS``): the node's default
item workers, the same with smaller items, the local executor, one item worker, and two
model actors sharing the GPU; each has a time limit, and a row is printed as each ends, so
a cut-off call still reports. The GPU's busy fraction is the mean of `nvidia-smi`'s
utilization samples (every 200 ms) while a run lasts ("n/a" without nvidia-smi: `--device
cpu` dry runs). The ratio column is end to end over model only (issue 36's target on one
GPU: >= 0.5).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class BusyMeter:
    """Samples the GPU's utilization while a ``with`` block runs."""

    def __enter__(self) -> BusyMeter:
        self.samples: list[float] = []
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", "200"], stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            out, _ = self.proc.communicate()
            self.samples = [float(v) for v in out.split() if v.strip().isdigit()]

    @property
    def busy(self) -> str:
        return f"{sum(self.samples) / len(self.samples):.0f}%" if self.samples else "n/a"


def corpus_units(corpus: str, tokenizer_name: str, unit_tokens: int) -> list[list[list[str]]]:
    """The corpus's sentences (``text`` of each JSON line, or plain lines), cut into
    windows of at most 256 tokens and grouped into units of ``unit_tokens`` tokens."""
    from pipeline.tokenize import get_tokenizer

    tokenizer = get_tokenizer(tokenizer_name)
    units: list[list[list[str]]] = [[]]
    size = 0
    for line in Path(corpus).read_text(encoding="utf-8").splitlines():
        text = json.loads(line).get("text", "") if corpus.endswith(".jsonl") else line
        for sentence in tokenizer.split_sentences(text):
            words = [t.text for t in sentence.tokens]
            for start in range(0, len(words), 256):
                piece = words[start:start + 256]
                if size + len(piece) > unit_tokens and units[-1]:
                    units.append([])
                    size = 0
                units[-1].append(piece)
                size += len(piece)
    return units


def model_only(args: argparse.Namespace) -> tuple[float, int, str]:
    import torch

    import elmo_model
    from pipeline.write.config import ModelSpec

    spec = ModelSpec.resolve(args.model)
    embedder = elmo_model.load(spec.options, spec.weights, mode="stateless",
                               device=args.device, dtype=args.compute_dtype,
                               max_batch_tokens=args.batch_tokens)
    units = corpus_units(args.corpus, args.tokenizer, args.unit_tokens)
    tokens = sum(len(s) for unit in units for s in unit)

    def one_pass() -> float:
        began = time.perf_counter()
        pending = None
        for unit in units:  # one unit ahead, as a model worker serves its item workers
            ahead = embedder.submit_int8(unit)
            if pending is not None:
                pending.result()
            pending = ahead
        if pending is not None:
            pending.result()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - began

    # The first pass compiles kernels and captures graphs for every padded length the
    # corpus has (an end-to-end run's processes find the compiled kernels on disk).
    first = one_pass()
    with BusyMeter() as meter:
        seconds = one_pass()
    graphs = getattr(embedder.step, "recurrence_graphs", None)
    padded = f", {graphs(embedder.device).padded_runs} time loops padded" if graphs else ""
    print(f"model only: first pass {first:.1f} s, timed pass {seconds:.1f} s{padded}",
          flush=True)
    if args.profile:  # where the host's time goes in a third pass, by function
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.runcall(one_pass)
        pstats.Stats(profile).sort_stats("tottime").print_stats(28)
    return tokens / seconds, tokens, meter.busy


def end_to_end(args: argparse.Namespace, corpus: str, extra: list[str], out: Path,
               limit_s: float) -> tuple[float, int, str, float, float]:
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "pipeline.cli", "embed", corpus, "--out", str(out),
               "--model", args.model, "--tokenizer", args.tokenizer, "--no-progress",
               "--device", args.device, "--compute-dtype", args.compute_dtype,
               "--dtype", "int8", "--batch-tokens", str(args.batch_tokens),
               "--unit-tokens", str(args.unit_tokens), *extra]
    with BusyMeter() as meter:
        began = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s,
                                  env={**os.environ, "PYTHONPATH": os.environ.get(
                                      "PYTHONPATH", str(REPO))})
        except subprocess.TimeoutExpired as stopped:
            subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"],
                           capture_output=True)
            tail = (stopped.stderr or b"")[-1500:]
            raise RuntimeError(f"over its {limit_s:.0f} s limit: {tail!r}") from None
        seconds = time.perf_counter() - began
    print(done.stderr[-1200:], flush=True)
    if done.returncode:
        raise RuntimeError(f"rc {done.returncode}: {done.stderr[-3000:]}")
    summary = next(line for line in done.stderr.splitlines() if line.startswith("embedded "))
    tokens = int(summary.split(" tokens in ")[0].rsplit(" ", 1)[1])
    starting = float(summary.split("; ")[-1].split(" s of it")[0])
    return tokens / seconds, tokens, meter.busy, seconds, starting


def prefix_corpus(corpus: str, tokens: int, work: Path) -> str:
    """The corpus's first lines holding about ``tokens`` tokens (5 bytes a token)."""
    path = work / f"prefix-{tokens}{Path(corpus).suffix}"
    kept, size = [], 0
    for line in Path(corpus).read_text(encoding="utf-8").splitlines(keepends=True):
        if size >= tokens * 5:
            break
        kept.append(line)
        size += len(line.encode())
    path.write_text("".join(kept), encoding="utf-8")
    return str(path)


# name -> (flags, tokens of the corpus it gets (None: all of it), seconds allowed)
RUNS = {
    "default": (["--executor", "ray"], None, 150),
    "one-worker": (["--executor", "ray", "--cpu-workers", "1"], 500_000, 90),
    "local": (["--executor", "local"], 500_000, 90),
    "default-64k-items": (["--executor", "ray", "--item-tokens", "65536"], None, 120),
    "two-models": (["--executor", "ray", "--actors", "2", "--gpus-per-actor", "0.5",
                    "--item-tokens", "65536"], None, 120),
    "four-models": (["--executor", "ray", "--actors", "4", "--gpus-per-actor", "0.25",
                     "--item-tokens", "65536"], None, 120),
}
TITLES = {
    "default": "end to end, the node's default item workers",
    "default-64k-items": "end to end, default workers, --item-tokens 65536",
    "local": "end to end, local executor (one process, 2 items on threads)",
    "one-worker": "end to end, 1 item worker per GPU (--cpu-workers 1)",
    "two-models": "end to end, 2 model actors on the GPU (0.5 each), default workers",
    "four-models": "end to end, 4 model actors on the GPU (0.25 each), default workers",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="a .jsonl (text field) or text file")
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokenizer", default="elmo-store-sentences")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compute-dtype", default="bfloat16")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--unit-tokens", type=int, default=0,
                        help="tokens per model call (default: 4 x --batch-tokens, as embed)")
    parser.add_argument("--runs", default=",".join(RUNS),
                        help=f"which end-to-end runs, in order (default: all of {list(RUNS)})")
    parser.add_argument("--profile", action="store_true",
                        help="also profile a model-only pass (cProfile, top functions)")
    parser.add_argument("--keep", default="", help="keep the dataset of the first run here")
    args = parser.parse_args()
    args.unit_tokens = args.unit_tokens or 4 * args.batch_tokens
    rate, tokens, busy = model_only(args)
    print(f"RESULT gpu_stages: {tokens:,} tokens, {args.device}, {args.compute_dtype}, int8, "
          f"{os.cpu_count()} CPUs, batches of {args.batch_tokens:,} tokens, model calls of "
          f"{args.unit_tokens:,}")
    print("| run | tokens | tokens/s (wall, Ray's start incl.) | of model only | tokens/s once "
          "started | of model only | GPU busy | wall (starting) |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| model only (embed_int8, one unit ahead) | {tokens:,} | {rate:,.0f} | 1.00 | | | "
          f"{busy} | |", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-stages-") as work:
        for name in filter(None, args.runs.split(",")):
            extra, prefix_tokens, limit_s = RUNS[name]
            if args.device == "cpu" and "ray" in extra:
                extra = [*extra, "--cpus-per-actor", "1"]
            corpus = args.corpus if prefix_tokens is None else prefix_corpus(
                args.corpus, prefix_tokens, Path(work))
            out = Path(args.keep) if args.keep and name == args.runs.split(",")[0] else \
                Path(work) / "ds"
            try:
                e2e, n, busy, wall, starting = end_to_end(args, corpus, extra, out, limit_s)
            except RuntimeError as failed:
                print(f"| {TITLES[name]} | failed: {str(failed)[-600:]} |", flush=True)
                continue
            started = n / max(1e-9, wall - starting)
            print(f"| {TITLES[name]} | {n:,} | {e2e:,.0f} | {e2e / rate:.2f} | {started:,.0f} | "
                  f"{started / rate:.2f} | {busy} | {wall:.0f} s ({starting:.0f} s) |",
                  flush=True)


if __name__ == "__main__":
    main()
