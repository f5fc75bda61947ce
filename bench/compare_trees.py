"""Embedding speed of two source trees, alternated in one sitting: is the new one slower?

    git worktree add /tmp/before <commit>      # or: git archive <commit> | tar -x -C /tmp/before
    .venv/bin/python bench/compare_trees.py /tmp/before . --config standard --threads 1,2

Each measurement is a fresh Python process that imports ``elmo_model`` from one tree and
embeds the same batches of running text (Austen, then Melville) with that tree's
``ElmoEmbedder`` (``lstm_impl`` auto; token cache off and one batch per call unless
``--cache-size`` and ``--max-batch-tokens`` say otherwise). Trees alternate old, new, old,
new, ... so that load from other processes hits both alike. Prints each run's median
tokens/s and, per setting, the ratio of the medians (new / old).

``--config``: ``standard`` (ELMo's 2 x 4096 cells, random weights), ``small``, or
``default`` (``models/default`` of each tree, its own weights).

``--clock cpu`` times each batch in CPU seconds of the process instead of wall seconds:
on a machine shared with other work, waiting for a core then does not count, which
makes one-thread comparisons far steadier (with more threads, spinning counts as work).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

# Run in the child: argv = tree, config, threads, dtype, sentences per batch, batches,
# cache size, max batch tokens, clock.
CHILD = """
import statistics, sys, time
tree, config_name, threads, dtype, per_batch, n_batches, cache, max_tokens, clock = sys.argv[1:10]
now = time.process_time if clock == "cpu" else time.perf_counter
sys.path.insert(0, tree)
sys.path.insert(1, {bench!r})
import torch
torch.set_num_threads(int(threads))
import elmo_model
from workload import CONFIGS, running_text
assert elmo_model.__file__.startswith(tree), elmo_model.__file__
options = dict(device="cpu", dtype=dtype, cache_size=int(cache),
               max_batch_tokens=int(max_tokens))
if config_name == "default":
    embedder = elmo_model.load(tree + "/models/default", **options)
else:
    torch.manual_seed(0)
    embedder = elmo_model.ElmoEmbedder(elmo_model.BiLM(CONFIGS[config_name]).eval(), **options)
per_batch, n_batches = int(per_batch), int(n_batches)
sentences = running_text(per_batch * n_batches, skip=3000)
batches = [sentences[i : i + per_batch] for i in range(0, len(sentences), per_batch)]
embedder.embed(batches[0])  # allocator, kernels, packings; the cache sees one batch
rates = []
for batch in batches:
    start = now()
    embedder.embed(batch)
    rates.append(sum(map(len, batch)) / (now() - start))
print(statistics.median(rates))
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path, help="the tree before the change")
    parser.add_argument("new", type=Path, help="the tree after it")
    parser.add_argument("--config", choices=["standard", "small", "default"],
                        default="standard")
    parser.add_argument("--threads", default="1", help="torch threads, e.g. 1,2")
    parser.add_argument("--dtypes", default="float32", help="e.g. float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=2, help="old/new pairs per setting")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per call")
    parser.add_argument("--cache-size", type=int, default=0, help="token cache entries")
    parser.add_argument("--max-batch-tokens", type=int, default=1 << 20,
                        help="the embedder's batch budget (its default is 4096)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="time batches in wall or process CPU seconds")
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    for name, tree in trees.items():
        if not (tree / "elmo_model" / "__init__.py").is_file():
            parser.error(f"{name} tree {tree} has no elmo_model/ package")
    child = CHILD.format(bench=str(BENCH))
    rows = []
    for threads in args.threads.split(","):
        for dtype in args.dtypes.split(","):
            rates: dict[str, list[float]] = {"old": [], "new": []}
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    result = subprocess.run(
                        [sys.executable, "-c", child, str(tree), args.config, threads, dtype,
                         str(args.batch_size), str(args.batches), str(args.cache_size),
                         str(args.max_batch_tokens), args.clock],
                        capture_output=True, text=True, check=False)
                    if result.returncode != 0:
                        sys.exit(f"{name} tree failed:\n{result.stderr[-3000:]}")
                    rates[name].append(float(result.stdout.split()[-1]))
                    print(f"{args.config} threads={threads} {dtype} {name}: "
                          f"{rates[name][-1]:.0f} tokens/s", flush=True)
            ratio = statistics.median(rates["new"]) / statistics.median(rates["old"])
            rows.append((threads, dtype, rates, ratio))
    print("\n| config | threads | dtype | old tok/s (runs) | new tok/s (runs) | new / old |")
    print("|---|---|---|---|---|---|")
    for threads, dtype, rates, ratio in rows:
        runs = {k: ", ".join(f"{r:.0f}" for r in v) for k, v in rates.items()}
        print(f"| {args.config} | {threads} | {dtype} | {runs['old']} | {runs['new']} | "
              f"{ratio:.2f}x |")


if __name__ == "__main__":
    main()
