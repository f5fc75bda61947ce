"""How much of the near-free models' model stage is their own matmuls (issue 36).

    .venv/bin/python bench/model_matmuls.py [--chars 600000]

The "near-free" wide model (bench/near_free_models.py, projection 512) is not free: each
direction's input and recurrent products are 512 x 128 and its output projection 32 x 512
per token, against 16 x 128 and 32 x 16 for the narrow one, so the issue's width cost
counts these FLOPs too. This runs ``submit_int8`` (what the CPU model stage runs) on
16k-token units of the corpus's first ``--chars`` characters, one thread, the worker's
mmap threshold, under cProfile, and prints CPU us per token of the model stage and of its
matmul calls (oneDNN's ``_linear_pointwise``, torch's ``addmm``/``addmm_``), per width.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
CORPORA = Path(os.environ.get("ELMO_BENCH_CORPORA", REPO.parent / "shared" / "corpora"))
MATMULS = ("_linear_pointwise", "addmm")  # addmm_ too


def units(path: Path, chars: int, unit_tokens: int = 16384) -> list[list[list[str]]]:
    """Whitespace sentences (a line each, at most 200 tokens) cut into units."""
    found, unit, size = [], [], 0
    for line in path.read_text()[:chars].splitlines():
        words = line.split()[:200]
        if not words:
            continue
        unit.append(words)
        size += len(words)
        if size >= unit_tokens:
            found.append(unit)
            unit, size = [], 0
    return found


def measure(width: str, work: Path, corpus: list[list[list[str]]]) -> tuple[float, float]:
    """(model stage, its matmuls) CPU us per token, the first unit as warm-up."""
    from near_free_models import PROJECTIONS, near_free_model

    from pipeline.write.config import ModelSpec
    from pipeline.write.work_item import load_embedder

    spec = ModelSpec.resolve(str(near_free_model(work / width, PROJECTIONS[width])))
    embedder = load_embedder(spec, 4096, "float32", "cpu")
    embedder.submit_int8(corpus[0], layer_0_per_type=True).result()
    tokens = sum(len(s) for unit in corpus[1:] for s in unit)
    profile = cProfile.Profile()
    t0 = time.process_time()
    profile.enable()
    for unit in corpus[1:]:
        embedder.submit_int8(unit, layer_0_per_type=True).result()
    profile.disable()
    total = time.process_time() - t0
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    # builtins' names: "<built-in method torch.addmm>", "<method 'addmm_' of ...>"
    matmuls = sum(row[2] for (_, _, name), row in stats.items()
                  if any(m in name for m in MATMULS))
    return total / tokens * 1e6, matmuls / tokens * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPORA / "austen.txt")
    parser.add_argument("--chars", type=int, default=600_000)
    args = parser.parse_args()
    import torch

    from pipeline.write.process_memory import fix_mmap_threshold

    torch.set_num_threads(1)
    fix_mmap_threshold()
    corpus = units(args.corpus, args.chars)
    work = Path(tempfile.mkdtemp(prefix="model-matmuls-"))
    got = {width: measure(width, work, corpus) for width in ("wide", "narrow")}
    print(f"model stage (submit_int8), one thread, {args.corpus.name}[:{args.chars:,}], "
          "CPU us per token (under cProfile)")
    print(f"{'width':<8} {'model':>8} {'matmuls':>8} {'rest':>8}")
    for width, (model, matmuls) in got.items():
        print(f"{width:<8} {model:>8.2f} {matmuls:>8.2f} {model - matmuls:>8.2f}")
    (wm, wx), (nm, nx) = got["wide"], got["narrow"]
    print(f"{'width':<8} {wm - nm:>8.2f} {wx - nx:>8.2f} {wm - nm - wx + nx:>8.2f}")


if __name__ == "__main__":
    main()
