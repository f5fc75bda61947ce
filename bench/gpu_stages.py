"""Issue 36 on one GPU: the model alone vs `elmo embed` end to end, with 1 item worker per
GPU and with the node's default (`--cpu-workers`), and how busy the GPU was in each.

    python3 bench/gpu_stages.py --corpus /tmp/wiki.jsonl --model /tmp/standard \\
        --tokenizer elmo-store-sentences --compute-dtype bfloat16

"Model only" is `ElmoEmbedder.embed_int8` (quantized on the device, copied to pinned host
memory) over the corpus's sentences in units of the pipeline's size, after one warm-up
unit; "end to end" is `elmo embed` from the file to committed int8 Parquet, Ray's start
included. The GPU's busy fraction is the mean of `nvidia-smi`'s utilization samples
(every 200 ms) while a run lasts ("n/a" without nvidia-smi: `--device cpu` dry runs).
Prints one table; the ratio column is end to end over model only (issue 36's target on
one GPU: >= 0.5).
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
    units = corpus_units(args.corpus, args.tokenizer, 4 * args.batch_tokens)
    embedder.embed_int8(units[0])  # warm-up: kernels, the token cache's first misses
    tokens = sum(len(s) for unit in units for s in unit)
    with BusyMeter() as meter:
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
        seconds = time.perf_counter() - began
    return tokens / seconds, tokens, meter.busy


def end_to_end(args: argparse.Namespace, extra: list[str], work: Path) -> tuple[float, str]:
    out = work / "ds"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "pipeline.cli", "embed", args.corpus, "--out", str(out),
               "--model", args.model, "--tokenizer", args.tokenizer, "--no-progress",
               "--device", args.device, "--compute-dtype", args.compute_dtype,
               "--dtype", "int8", "--batch-tokens", str(args.batch_tokens), *extra]
    with BusyMeter() as meter:
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        seconds = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(f"elmo embed {' '.join(extra)} failed:\n{done.stderr[-3000:]}")
    tokens = next(int(line.split(" tokens in ")[0].rsplit(" ", 1)[1])
                  for line in done.stderr.splitlines() if line.startswith("embedded "))
    return tokens / seconds, meter.busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="a .jsonl (text field) or text file")
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokenizer", default="elmo-store-sentences")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compute-dtype", default="bfloat16")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    args = parser.parse_args()
    rate, tokens, busy = model_only(args)
    rows = [("model only (embed_int8, one unit ahead)", rate, busy)]
    runs = {"end to end, 1 item worker per GPU": ["--executor", "ray", "--cpu-workers", "1"],
            "end to end, the node's default workers": ["--executor", "ray"]}
    with tempfile.TemporaryDirectory(prefix="gpu-stages-") as work:
        for name, extra in runs.items():
            if args.device == "cpu":
                extra = [*extra, "--cpus-per-actor", "1"]
            e2e, busy = end_to_end(args, extra, Path(work))
            rows.append((name, e2e, busy))
    print(f"RESULT gpu_stages: {tokens:,} tokens, {args.device}, {args.compute_dtype}, int8, "
          f"{os.cpu_count()} CPUs")
    print("| run | tokens/s | of model only | GPU busy |")
    print("|---|---|---|---|")
    for name, value, busy in rows:
        print(f"| {name} | {value:,.0f} | {value / rate:.2f} | {busy} |")


if __name__ == "__main__":
    main()
