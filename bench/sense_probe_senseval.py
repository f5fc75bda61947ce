"""Which biLM layer serves word senses, on the sense-tagged "line", "hard", "serve" and
"interest" corpus (Senseval-2 as NLTK distributes it: 15,225 contexts of four words, each
labelled with one of 3-6 senses; never in the training corpora, which exclude annotated
text), with bootstrap 95% intervals.

    # NLTK's package, from the nltk_data repository (packages/corpora/senseval.zip)
    unzip senseval.zip -d /tmp/nltk
    PYTHONPATH=$PWD .venv/bin/python bench/sense_probe_senseval.py models/default \\
        --senseval-dir /tmp/nltk/senseval --random-floor

Each context (word forms as tagged; the corpus is lower-cased) is embedded as one sequence
with the model's own start, and the target word's vector is read from every layer. Per
word, the contexts are split in half at random (fixed seed, each sense split alike); the
training half gives each sense a representation, the mean of its unit vectors, and a
test context takes the sense whose representation is nearest (cosine): the ELMo paper's
nearest-neighbour sense disambiguation (section 5.3), here per word. Also scored: the
nearest single training context (1-NN), and the training half's most frequent sense.

Intervals: ``--resamples`` bootstrap resamples of the test contexts (percentile 95%), the
same resamples for every layer, so ``layer 2 - layer 1`` is a paired difference.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from layer_probe import (
    bootstrap_draws,
    bootstrap_interval,
    common_options,
    interval_table,
    load_embedder,
    model_runs,
)

WORD_FORM = re.compile(r'<wf pos="[^"]*">([^<]*)</wf>')
ANSWER = re.compile(r'senseid="([^"]+)"')


@dataclass(frozen=True)
class Context:
    word: str  # the corpus file's word: hard, interest, line, serve
    words: tuple[str, ...]
    position: int  # of the target word
    sense: str


def read_senseval(folder: Path) -> list[Context]:
    """Every instance with one answer and a marked head word."""
    contexts = []
    for path in sorted(folder.glob("*.pos")):
        for instance in path.read_text(encoding="latin-1").split("<instance ")[1:]:
            senses = ANSWER.findall(instance)
            body = instance.split("<context>", 1)[1].split("</context>", 1)[0]
            before, head, _ = body.partition("<head>")
            if len(senses) != 1 or not head:
                continue
            words = WORD_FORM.findall(body)
            position = len(WORD_FORM.findall(before))
            if position < len(words):
                contexts.append(Context(path.stem, tuple(words), position, senses[0]))
    return contexts


def target_vectors(embedder, contexts: list[Context]) -> np.ndarray:
    """``[contexts, L + 1, 2P]``: the target word in every layer."""
    layers = embedder.embed([list(c.words) for c in contexts])
    return np.stack([layer[:, c.position] for layer, c in zip(layers, contexts, strict=True)])


def split_halves(contexts: list[Context], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices: each (word, sense)'s contexts halved at random."""
    rng = np.random.default_rng(seed)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(contexts):
        groups.setdefault((c.word, c.sense), []).append(i)
    train, test = [], []
    for key in sorted(groups):
        members = rng.permutation(groups[key])
        train += members[: len(members) // 2].tolist()
        test += members[len(members) // 2:].tolist()
    return np.array(sorted(train)), np.array(sorted(test))


def sense_scores(vectors: np.ndarray, contexts: list[Context], train: np.ndarray,
                 test: np.ndarray) -> dict[str, np.ndarray]:
    """0/1 per test context, in ``test`` order: nearest sense mean and 1-NN per layer,
    and the most frequent sense."""
    senses = np.array([c.sense for c in contexts])
    words = np.array([c.word for c in contexts])
    scores: dict[str, np.ndarray] = {}
    for layer in range(vectors.shape[1]):
        unit = vectors[:, layer] / np.maximum(
            np.linalg.norm(vectors[:, layer], axis=1, keepdims=True), 1e-12)
        mean_hit = np.zeros(len(test))
        nn_hit = np.zeros(len(test))
        for word in np.unique(words):
            tr, te = train[words[train] == word], np.flatnonzero(words[test] == word)
            labels = np.unique(senses[tr])
            means = np.stack([unit[tr][senses[tr] == s].mean(axis=0) for s in labels])
            means /= np.linalg.norm(means, axis=1, keepdims=True)
            queries = unit[test[te]]
            mean_hit[te] = labels[(queries @ means.T).argmax(axis=1)] == senses[test[te]]
            nn_hit[te] = senses[tr][(queries @ unit[tr].T).argmax(axis=1)] == senses[test[te]]
        scores[f"layer{layer}, nearest sense mean"] = mean_hit
        scores[f"layer{layer}, nearest context"] = nn_hit
    frequent = {w: Counter(senses[train][words[train] == w]).most_common(1)[0][0]
                for w in np.unique(words)}
    scores["most frequent sense"] = np.array(
        [frequent[words[i]] == senses[i] for i in test], dtype=float)
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", nargs="+", help="one or more model directories")
    parser.add_argument("--senseval-dir", required=True,
                        help="the unzipped folder with hard.pos, interest.pos, line.pos, serve.pos")
    common_options(parser, "also score the first model's network with random weights")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    contexts = read_senseval(Path(args.senseval_dir))
    train, test = split_halves(contexts, args.seed)
    per_word = Counter(c.word for c in contexts)
    counts = ", ".join(f"{w} {n:,}" for w, n in sorted(per_word.items()))
    print(f"{len(contexts):,} contexts ({counts}); {len(train):,} train / {len(test):,} test",
          flush=True)
    draws = bootstrap_draws(len(test), args.resamples, args.seed)

    results: dict[str, dict] = {}
    for name, model_dir, random_weights in model_runs(args.model_dir, args.random_floor):
        vectors = target_vectors(load_embedder(model_dir, random_weights), contexts)
        scores = sense_scores(vectors, contexts, train, test)
        for method in ("nearest sense mean", "nearest context"):
            scores[f"layer2 - layer1, {method}"] = (scores[f"layer2, {method}"]
                                                    - scores[f"layer1, {method}"])
        results[name] = {row: list(bootstrap_interval(v, draws)) for row, v in scores.items()}
        print(f"{name}: {time.perf_counter() - start:.0f}s", flush=True)
    print("\nsenses (line, hard, serve, interest): accuracy [95% bootstrap interval]")
    print(interval_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
