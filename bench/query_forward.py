"""A query's forward pass: one new sentence a call through ``ElmoEmbedder.embed``, as the
CLI's query-model process and the API run it (the process's default torch threads),
wall p50 and CPU ms a call, with the load average. Compare two trees by alternating:

    git archive <commit> | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before .venv/bin/python bench/query_forward.py --model models/default
    PYTHONPATH=. .venv/bin/python bench/query_forward.py --model models/default

Each call's sentence is new (its first word numbered), so no layer cache could answer it;
its other words are in the token cache after the warm-up, as on a server that has run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

QUERY = "And God said , Let there be light : and there was the light upon the water"


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="models/default", help="a model directory")
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    import torch

    import elmo_model

    embedder = elmo_model.load(args.model, mode="stateless", device="cpu")
    words = QUERY.split()
    for i in range(3):
        embedder.embed([[f"warm{i}", *words[1:]]])
    times, cpu = [], _cpu_s()
    for i in range(args.calls):
        began = time.perf_counter()
        embedder.embed([[f"q{i}", *words[1:]]])
        times.append((time.perf_counter() - began) * 1000)
    print(json.dumps({"model": args.model, "torch_threads": torch.get_num_threads(),
                      "tokens": len(words), "p50_ms": round(statistics.median(times), 1),
                      "cpu_ms_a_call": round((_cpu_s() - cpu) * 1000 / args.calls, 1),
                      "load_average": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
