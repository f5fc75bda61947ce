"""End-to-end `elmo embed` under several settings (or trees), alternated, in fresh processes:
medians of wall seconds and of CPU seconds (user + sys) of everything a run starts.

    .venv/bin/python bench/executor_ab.py --corpus /work/shared/corpora/austen.txt \\
        --rounds 3 --run 'local=--executor local' \\
        --run 'stages=--executor ray --cpus-per-actor 1 --cpu-workers 1' \\
        --run 'base=/path/to/old/tree::--executor local'

A run is ``NAME=[TREE::]ARGS``: ARGS are added to ``elmo embed CORPUS --out DIR
--no-progress``; with TREE the run imports that tree's code (``PYTHONPATH=TREE python -m
pipeline.cli``), else this one's. Rounds run every setting once, in the order given.

CPU time is read from a cpuacct cgroup made for each run (Linux cgroup v1, root): Ray's
raylet and worker processes are descendants of the run and are counted, which the
run's own ``getrusage`` would miss. Where no cgroup can be made the CPU column is the
children's rusage (processes Ray does not reap are then missing) and says so.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")


def run_once(name: str, tree: str | None, args: list[str], corpus: str, work: Path
             ) -> dict[str, float]:
    out = work / f"ds-{name}"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    command = [sys.executable, "-m", "pipeline.cli", "embed", corpus, "--out", str(out),
               "--no-progress", *args]
    if tree:
        env["PYTHONPATH"] = tree
    group = CGROUP_ROOT / f"executor-ab-{os.getpid()}-{name}"
    counted = "cgroup"
    try:
        group.mkdir()
        enter = f"echo $$ > {group}/cgroup.procs && exec \"$@\""
        command = ["sh", "-c", enter, "sh", "/usr/bin/time", "-f", "%M", *command]
    except OSError:
        group, counted = None, "rusage"
        command = ["/usr/bin/time", "-f", "%M", *command]
    before = os.times()
    t0 = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = os.times()
        if group is not None:
            user = int((group / "cpuacct.usage_user").read_text()) / 1e9
            system = int((group / "cpuacct.usage_sys").read_text()) / 1e9
    finally:
        if group is not None:
            for _ in range(20):  # Ray's last processes leave the group
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.5)
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stderr[-2000:]}")
    if group is None:
        user = after.children_user - before.children_user
        system = after.children_system - before.children_system
    rate = re.search(r"\(([\d,]+) tokens/s", done.stderr)  # `elmo embed`'s summary
    tokens = re.search(r"sentences, (\d+) tokens in", done.stderr)
    shutil.rmtree(out, ignore_errors=True)
    return {"wall": wall, "user": user, "sys": system, "cpu": user + system,
            "peak_mib": int(done.stderr.strip().splitlines()[-1]) / 1024,
            "tokens_per_s": float(rate.group(1).replace(",", "")) if rate else 0.0,
            "tokens": float(tokens.group(1)) if tokens else 0.0, "counted": counted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--run", action="append", required=True, metavar="NAME=[TREE::]ARGS")
    args = parser.parse_args()
    runs = []
    for spec in args.run:
        name, _, rest = spec.partition("=")
        tree, _, extra = rest.rpartition("::")
        runs.append((name, tree or None, extra.split()))
    results: dict[str, list[dict]] = {name: [] for name, _, _ in runs}
    with tempfile.TemporaryDirectory(prefix="executor-ab-") as work:
        for round_ in range(args.rounds):
            for name, tree, extra in runs:
                result = run_once(name, tree, extra, args.corpus, Path(work))
                results[name].append(result)
                print(f"round {round_ + 1} {name}: wall {result['wall']:.1f} s, CPU "
                      f"{result['user']:.1f} + {result['sys']:.1f} s ({result['counted']}), "
                      f"{result['tokens_per_s']:,.0f} tok/s, peak {result['peak_mib']:.0f} MiB",
                      flush=True)
    first = runs[0][0]
    base_wall = statistics.median(r["wall"] for r in results[first])
    base_cpu = statistics.median(r["cpu"] for r in results[first])
    print(f"\nmedians over {args.rounds} rounds ({int(results[first][0]['tokens']):,} tokens); "
          f"ratios to {first}")
    print("| run | wall s | CPU s (user + sys) | wall ratio | CPU ratio | tokens/s | peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for name, _, _ in runs:
        rows = results[name]
        wall = statistics.median(r["wall"] for r in rows)
        cpu = statistics.median(r["cpu"] for r in rows)
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {wall / base_wall:.2f} | "
              f"{cpu / base_cpu:.2f} | {statistics.median(r['tokens_per_s'] for r in rows):,.0f}"
              f" | {statistics.median(r['peak_mib'] for r in rows):.0f} |")


if __name__ == "__main__":
    main()
