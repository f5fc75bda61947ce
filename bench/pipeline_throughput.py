"""Pipeline at corpus scale: tokens/s, peak RSS of every process, bytes through the driver.

Two scenarios (one command each):

* ``--scenario scale`` (default): a near-free model (2 layers x 32 cells, projection 16:
  the model's cost drops out) over ~1M tokens (austen.txt) and ~13M tokens (the four
  shared books x 4; ``--sizes small,large,huge`` adds ~42M, the books x 13; ``books``, the
  four books once, 3.2M, cuts the same items as ``large`` and ``huge``, so its peak RSS
  compares corpus sizes at one item size), with the
  local executor and with Ray (``--actors`` actors). Each run
  is its own process, so its peak RSS is that run's: the driver's from getrusage, every
  worker's (Ray actors) from the commit records it returned. Also the bytes the driver
  received from workers (the pickled commit records) next to the activation bytes the
  workers wrote: the driver sees no activations.
* ``--scenario model``: a real model (``--model``, default the bundled one) over the first
  ``--tokens`` tokens of the shared books: model-only tokens/s (the same windows, in
  units of the pipeline's size, straight through ``ElmoEmbedder.embed``) vs end to end
  (text files -> committed Parquet), local and Ray.

    .venv/bin/python bench/pipeline_throughput.py --scenario scale --json runs/scale.json
    .venv/bin/python bench/pipeline_throughput.py --scenario model --tokens 1000000

Corpora come from ../shared/corpora, or $ELMO_BENCH_CORPORA (benchmarks only; tests
never read them).
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
# A git worktree lies elsewhere than the checkout beside ../shared: say where it is.
CORPORA = Path(os.environ.get("ELMO_BENCH_CORPORA", REPO.parent / "shared" / "corpora"))


def near_free_model(folder: Path) -> Path:
    import torch

    from elmo_model import BiLM, BiLMConfig, save_model_dir

    torch.manual_seed(0)
    config = BiLMConfig(n_layers=2, lstm_dim=32, projection_dim=16, char_embedding_dim=4,
                        filters=((1, 8), (2, 8)), n_highway=1)
    return save_model_dir(BiLM(config), folder)


def copy_books(folder: Path, names: list[str], copies: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        for k in range(copies):
            shutil.copy(CORPORA / name, folder / f"{Path(name).stem}-{k}.txt")
    return folder


def take_corpus(folder: Path, n_tokens: int) -> Path:
    """The first lines of each shared book, round robin, until about n_tokens words."""
    folder.mkdir(parents=True, exist_ok=True)
    files = sorted(CORPORA.glob("*.txt"))
    per_file = n_tokens // len(files)
    for path in files:
        lines, words = [], 0
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                lines.append(line.rstrip("\n"))
                words += len(line.split())
                if words >= per_file:
                    break
        (folder / path.name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


# --------------------------------------------------------------------------- one run


def one_run(args: argparse.Namespace) -> None:
    """A single embed in this process; prints its measurements as JSON (last line)."""
    import torch

    from pipeline.write.embed import EmbedConfig, ModelSpec, embed_corpus

    torch.set_num_threads(1 if args.executor == "ray" else args.threads)
    out = Path(args.out)
    t0 = time.perf_counter()
    summary = embed_corpus(EmbedConfig(
        sources=[f"{args.corpus}/*.txt"], out=str(out), model=ModelSpec.resolve(args.model),
        executor=args.executor, actors=args.actors, cpus_per_actor=1.0 if args.actors else None,
        batch_tokens=args.batch_tokens, tokenizer=args.tokenizer, min_items=args.shards,
        progress=False))
    seconds = time.perf_counter() - t0
    token_bytes = sum(p.stat().st_size for p in out.glob("tokens/*/*.parquet"))
    print(json.dumps({
        "executor": args.executor, "tokens": summary.tokens, "seconds": seconds,
        "tok_s": summary.tokens / seconds, "items": summary.items_written,
        "driver_peak_rss": summary.driver_peak_rss,
        "worker_peak_rss": max(summary.worker_peak_rss.values(), default=0),
        "workers": len(summary.worker_peak_rss),
        "returned_bytes": summary.returned_bytes, "token_file_bytes": token_bytes,
    }))


def run_child(model: Path, corpus: Path, out: Path, executor: str, actors: int,
              batch_tokens: int, threads: int, tokenizer: str | None, shards: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, __file__, "--one-run", "--model", str(model), "--corpus", str(corpus),
           "--out", str(out), "--executor", executor, "--actors", str(actors),
           "--batch-tokens", str(batch_tokens), "--threads", str(threads)]
    cmd += ["--tokenizer", tokenizer] if tokenizer else []
    cmd += ["--shards", str(shards)]
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.rmtree(out, ignore_errors=True)
    return result


# --------------------------------------------------------------------------- scenarios


def scale(args: argparse.Namespace, work: Path) -> dict:
    model = near_free_model(work / "model")
    books = sorted(p.name for p in CORPORA.glob("*.txt"))
    copies = {"small": (["austen.txt"], 1), "books": (books, 1), "large": (books, 4),
              "huge": (books, 13)}
    corpora = {size: copy_books(work / size, *copies[size]) for size in args.sizes.split(",")}
    results: dict[str, object] = {}
    for repeat in range(args.repeats):
        for size, corpus in corpora.items():
            for executor in args.executors.split(","):
                actors = args.actors if executor == "ray" else 1
                r = run_child(model, corpus, work / "out", executor, actors, args.batch_tokens,
                              threads=1, tokenizer=args.tokenizer or "elmo-store-ptb",
                              shards=args.shards)
                key = f"{size}_{executor}"
                print(f"[{repeat}] {key}: {r['tokens']:,} tokens {r['tok_s']:,.0f} tok/s, "
                      f"driver peak {r['driver_peak_rss'] / 2**20:,.0f} MiB, worker peak "
                      f"{r['worker_peak_rss'] / 2**20:,.0f} MiB ({r['workers']} workers), "
                      f"{r['items']} items, returned {r['returned_bytes']:,} B vs "
                      f"{r['token_file_bytes']:,} B of token files", flush=True)
                results.setdefault(key, []).append(r)  # type: ignore[union-attr]
    summary: dict[str, object] = {"runs": results}
    if len(corpora) < 2 or "small" not in corpora or "large" not in corpora \
            or args.executors != "local,ray":
        return summary
    for key, runs in results.items():
        summary[f"{key}_tok_s_median"] = sorted(r["tok_s"] for r in runs)[len(runs) // 2]  # type: ignore[union-attr]
        summary[f"{key}_driver_peak_mib"] = max(r["driver_peak_rss"] for r in runs) / 2**20  # type: ignore[union-attr]
        summary[f"{key}_worker_peak_mib"] = max(r["worker_peak_rss"] for r in runs) / 2**20  # type: ignore[union-attr]
    for executor in ("local", "ray"):
        for who in ("driver", "worker"):
            small = summary[f"small_{executor}_{who}_peak_mib"]
            large = summary[f"large_{executor}_{who}_peak_mib"]
            summary[f"{executor}_{who}_rss_ratio_large_small"] = large / small  # type: ignore[operator]
    summary["ray_vs_local_large"] = (summary["large_ray_tok_s_median"]  # type: ignore[operator]
                                     / summary["large_local_tok_s_median"])
    return summary


def model_vs_pipeline(args: argparse.Namespace, work: Path) -> dict:
    import torch

    import elmo_model
    from pipeline.tokenize import get_tokenizer, model_tokenizer, windows
    from pipeline.write.inputs import ReadOptions, list_sources
    from pipeline.write.read import read_documents

    model = Path(args.model) if args.model else elmo_model.default_model_dir()
    corpus = take_corpus(work / "corpus", args.tokens)
    options = str(model / "options.json")
    split = get_tokenizer(args.tokenizer or model_tokenizer(options)).split_sentences
    sentences: list[list[str]] = []
    n_stored = 0
    for doc in read_documents(list_sources([f"{corpus}/*.txt"]), ReadOptions()):
        for sentence in split(getattr(doc, "text", "")):
            words = sentence.words
            n_stored += len(words)
            sentences += [words[w.start:w.end] for w in windows(len(words), 256, 32)]

    def model_only() -> float:
        torch.set_num_threads(args.threads)
        embedder = elmo_model.load_model_dir(model, max_batch_tokens=args.batch_tokens)
        embedder.embed([["warm", "up"]])
        chunk, size, t0 = [], 0, time.perf_counter()
        for sentence in [*sentences, None]:
            if sentence is not None:
                chunk.append(sentence)
                size += len(sentence)
            if chunk and (sentence is None or size >= 4 * args.batch_tokens):
                embedder.embed(chunk)
                chunk, size = [], 0
        return n_stored / (time.perf_counter() - t0)

    results: dict[str, object] = {"tokens": n_stored, "model": str(model)}
    for repeat in range(args.repeats):
        rate = model_only()
        print(f"[{repeat}] model only: {rate:,.0f} tok/s ({args.threads} threads)", flush=True)
        results.setdefault("model_only", []).append(rate)  # type: ignore[union-attr]
        for executor in ("local", "ray"):
            actors = args.actors if executor == "ray" else 1
            r = run_child(model, corpus, work / "out", executor, actors, args.batch_tokens,
                          threads=args.threads, tokenizer=args.tokenizer, shards=8)
            print(f"[{repeat}] {executor}: {r['tok_s']:,.0f} tok/s end to end", flush=True)
            results.setdefault(executor, []).append(r["tok_s"])  # type: ignore[union-attr]
    for key in ("model_only", "local", "ray"):
        runs = sorted(results[key])  # type: ignore[arg-type]
        results[f"{key}_median"] = runs[len(runs) // 2]
    for key in ("local", "ray"):
        results[f"{key}_ratio"] = results[f"{key}_median"] / results["model_only_median"]  # type: ignore[operator]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=("scale", "model"), default="scale")
    parser.add_argument("--model", help="model directory (model scenario; default: bundled)")
    parser.add_argument("--tokens", type=int, default=1_000_000,
                        help="corpus size in words (model scenario)")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--actors", type=int, default=2, help="Ray actors (1 CPU each)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, local runs")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--sizes", default="small,large",
                        help="scale scenario corpora: small (austen.txt, 0.86M tokens), books "
                             "(the four books once, 3.2M), large (x 4, 12.9M), huge (x 13, "
                             "42M)")
    parser.add_argument("--executors", default="local,ray", help="scale scenario executors")
    parser.add_argument("--shards", type=int, default=1,
                        help="minimum item count (scale scenario; default 1: items of "
                             "--item-tokens at both sizes, so peak RSS compares corpus sizes "
                             "at one item size)")
    parser.add_argument("--tokenizer", help="default: elmo-store-ptb for the near-free model "
                                            "(as the issue's baseline), the model's own else")
    parser.add_argument("--json", help="write the results here too")
    # Internal: one measured run in a fresh process.
    parser.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--executor", default="local", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run:
        one_run(args)
        return
    work = Path(tempfile.mkdtemp(prefix="elmo-bench-"))
    try:
        results = scale(args, work) if args.scenario == "scale" else model_vs_pipeline(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for key, value in results.items():
        if key != "runs":
            print(f"{key:36s} {value:,.3f}" if isinstance(value, float) else f"{key:36s} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
