"""Tokenizer throughput: tokens/s of every registered tokenizer on the same text, one run.

Each repeat times ``split_sentences`` (what ``elmo embed`` calls: words, offsets and
sentences) over every document, a document being one line of the corpus file (a
paragraph). For ``moses`` it also splits the time: sacremoses alone on the same lines
(strings, no offsets; plain ``MosesTokenizer`` and ours with the faster predicates), then
our alignment of its strings back to the source, then the sentence grouping, to show
where the time goes. Medians over the repeats; the first
call of each tokenizer (imports, Moses' word lists) is not timed.

    .venv/bin/python bench/tokenizer_throughput.py
    .venv/bin/python bench/tokenizer_throughput.py --corpus ../shared/corpora/austen.txt \\
        --chars 1000000 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO.parent / "shared" / "corpora" / "austen.txt"


def median_seconds(work: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--chars", type=int, default=1_000_000,
                        help="read this many characters of the corpus (whole lines)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from elmo_model.tokenizers import get_tokenizer, moses, tokenizer_names
    from elmo_model.tokenizers.text import blank_out_controls, group_sentences

    text = args.corpus.read_text(encoding="utf-8")[: args.chars]
    documents = [line for line in text[: text.rfind("\n")].split("\n") if line.strip()]
    print(f"{args.corpus.name}: {len(documents):,} documents, "
          f"{sum(map(len, documents)):,} characters, {args.repeats} repeats (median)")

    results: dict[str, dict[str, float]] = {}
    for name in tokenizer_names():
        tokenizer = get_tokenizer(name)
        tokenizer.split_sentences(documents[0])  # warm: imports, word lists
        n_tokens = sum(len(s.tokens) for d in documents for s in tokenizer.split_sentences(d))
        seconds = median_seconds(
            lambda t=tokenizer: [t.split_sentences(d) for d in documents], args.repeats)
        results[name] = {"tokens": n_tokens, "seconds": seconds,
                         "tokens_per_s": n_tokens / seconds}

    # Where moses' time goes: the same lines through each stage on its own.
    lines = [blank_out_controls(d) for d in documents]
    from sacremoses import MosesTokenizer

    engine = moses._moses()
    plain = MosesTokenizer(lang="en")
    pieces = [engine.tokenize(line, escape=False) for line in lines]
    aligned = [moses._align(d, line, p, 0, len(line))
               for d, line, p in zip(documents, lines, pieces, strict=True)]
    stages: dict[str, Callable[[], object]] = {
        "plain sacremoses only": lambda: [plain.tokenize(line, escape=False) for line in lines],
        "sacremoses only": lambda: [engine.tokenize(line, escape=False) for line in lines],
        "alignment only": lambda: [moses._align(d, line, p, 0, len(line))
                                   for d, line, p in zip(documents, lines, pieces, strict=True)],
        "grouping only": lambda: [group_sentences(d, t)
                                  for d, t in zip(documents, aligned, strict=True)],
    }
    n_moses = int(results["moses"]["tokens"])
    for stage, work in stages.items():
        seconds = median_seconds(work, args.repeats)
        results[f"moses: {stage}"] = {"tokens": n_moses, "seconds": seconds,
                                      "tokens_per_s": n_moses / seconds}

    print(f"{'tokenizer':<28} {'tokens':>9} {'seconds':>8} {'tokens/s':>10}")
    for name, row in results.items():
        print(f"{name:<28} {row['tokens']:>9,} {row['seconds']:>8.3f} "
              f"{row['tokens_per_s']:>10,.0f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
