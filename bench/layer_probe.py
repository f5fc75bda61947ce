"""Which biLM layer serves part of speech and which serves word senses, on WordNet's
example sentences (never in the training corpora, which exclude dictionaries), with
bootstrap 95% intervals.

    apt-get install wordnet-base        # WordNet 3.0 (Princeton WordNet 3.0 licence)
    PYTHONPATH=$PWD .venv/bin/python bench/layer_probe.py models/default --random-floor

Items: every quoted example in a synset's gloss (``data.noun``, ``.verb``, ``.adj``,
``.adv``) that contains one of the synset's one-word lemmas (any inflection: same
Snowball stem, or WordNet's exception lists) gives one target token labelled with its
synset and its part of speech (noun, verb, adjective, adverb). Sentences are cut with
``elmo-store-sentences`` and embedded with the model's own start (``initial_state``
auto).

- POS: per layer, scikit-learn's ``LogisticRegression`` on the target token's vector,
  trained on a random half of the examples (fixed seed), scored on the other half.
  Baseline: the word's most frequent tag in the training half (unseen words: the most
  frequent tag overall).
- Senses: for each (lemma, POS) with examples in at least two synsets, every example's
  nearest other example of the same lemma and POS (cosine) is a hit when it is in the
  same synset. Baselines: the most frequent synset among the lemma's other examples
  (leave-one-out), and WordNet's first sense.

Intervals: ``--resamples`` bootstrap resamples of the scored examples (percentile 95%),
the same resamples for every layer, so the layer-1 minus layer-2 difference is paired.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

POS_FILES = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}
EXAMPLE_RE = re.compile(r'"([^"]+)"')


@dataclass(frozen=True)
class Item:
    sentence: tuple[str, ...]
    position: int  # target token index in sentence
    lemma: str
    pos: str  # n, v, a, r
    synset: str  # offset + pos


def bootstrap_interval(correct: np.ndarray, resamples: np.ndarray,
                       level: float = 0.95) -> tuple[float, float, float]:
    """Mean of the 0/1 (or any) scores ``correct`` ``[n]`` and its percentile interval
    over the bootstrap index draws ``resamples`` ``[B, n]``."""
    means = correct[resamples].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(correct.mean()), float(low), float(high)


def bootstrap_draws(n: int, count: int, seed: int) -> np.ndarray:
    """``count`` resamples with replacement of ``n`` indices ``[count, n]``."""
    return np.random.default_rng(seed).integers(0, n, size=(count, n))


def read_wordnet(wordnet_dir: Path) -> tuple[list[Item], dict[tuple[str, str], str]]:
    """Example items of every synset, and each (lemma, pos)'s first sense (synset)."""
    from elmo_model.tokenizers import get_tokenizer
    from pipeline.lookup.index.words import stem_words  # the index's stems: Snowball English

    def stem(word: str) -> str:
        return stem_words([word])[0]

    tokenizer = get_tokenizer("elmo-store-sentences")
    items: list[Item] = []
    first_sense: dict[tuple[str, str], str] = {}
    for name, pos in POS_FILES.items():
        exceptions: dict[str, str] = {}
        for line in (wordnet_dir / f"{name}.exc").read_text().splitlines():
            inflected, *bases = line.split()
            if bases:
                exceptions[inflected] = bases[0]
        for line in (wordnet_dir / f"index.{name}").read_text().splitlines():
            if line.startswith(" "):
                continue
            fields = line.split()
            n_synsets, n_pointers = int(fields[2]), int(fields[3])
            first_sense[(fields[0], pos)] = fields[6 + n_pointers] + pos
            assert len(fields) == 6 + n_pointers + n_synsets, line
        for line in (wordnet_dir / f"data.{name}").read_text(encoding="latin-1").splitlines():
            if line.startswith(" ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            fields = head.split()
            n_words = int(fields[3], 16)
            lemmas = [re.sub(r"\(.*\)$", "", fields[4 + 2 * i]).lower()
                      for i in range(n_words)]
            lemmas = [w for w in lemmas if "_" not in w and w.isalpha()]
            synset = fields[0] + pos
            for example in EXAMPLE_RE.findall(gloss):
                words = [t.text for t in tokenizer.tokenize(example)]
                found = _find_target(words, lemmas, exceptions, stem)
                if found is not None:
                    position, lemma = found
                    items.append(Item(tuple(words), position, lemma, pos, synset))
    return items, first_sense


def _find_target(words: list[str], lemmas: list[str], exceptions: dict[str, str],
                 stem) -> tuple[int, str] | None:
    for lemma in lemmas:
        lemma_stem = stem(lemma)
        for i, word in enumerate(words):
            lower = word.lower()
            if lower == lemma or exceptions.get(lower) == lemma or stem(lower) == lemma_stem:
                return i, lemma
    return None


def target_vectors(embedder, items: list[Item]) -> np.ndarray:
    """``[n_items, L + 1, 2P]``: each item's target token in every layer (each distinct
    sentence embedded once)."""
    sentences = sorted({item.sentence for item in items})
    index = {s: i for i, s in enumerate(sentences)}
    layers = embedder.embed([list(s) for s in sentences])
    return np.stack([layers[index[item.sentence]][:, item.position] for item in items])


def pos_probe(vectors: np.ndarray, items: list[Item], train: np.ndarray,
              test: np.ndarray) -> dict[str, np.ndarray]:
    """Per-example 0/1 correctness on the test half: each layer's linear probe, and the
    majority-tag-per-word baseline."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    tags = np.array([item.pos for item in items])
    scored: dict[str, np.ndarray] = {}
    for layer in range(vectors.shape[1]):
        scaler = StandardScaler().fit(vectors[train, layer])
        probe = LogisticRegression(max_iter=2000, C=0.1)
        probe.fit(scaler.transform(vectors[train, layer]), tags[train])
        predicted = probe.predict(scaler.transform(vectors[test, layer]))
        scored[f"layer{layer}"] = (predicted == tags[test]).astype(float)
    by_word: dict[str, Counter] = defaultdict(Counter)
    for i in train:
        by_word[items[i].sentence[items[i].position].lower()][tags[i]] += 1
    overall = Counter(tags[train]).most_common(1)[0][0]
    guess = [by_word[items[i].sentence[items[i].position].lower()].most_common(1)[0][0]
             if by_word.get(items[i].sentence[items[i].position].lower()) else overall
             for i in test]
    scored["majority tag per word"] = (np.array(guess) == tags[test]).astype(float)
    return scored


def sense_groups(items: list[Item], min_synsets: int = 2) -> list[list[int]]:
    """Item indices of each (lemma, pos), keeping only synsets with at least two examples
    of it (so every example has a same-sense neighbour to find), and only lemmas left
    with at least ``min_synsets`` such synsets (so there is a wrong one to find too)."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, item in enumerate(items):
        groups[(item.lemma, item.pos)].append(i)
    kept = []
    for group in groups.values():
        counts = Counter(items[i].synset for i in group)
        group = [i for i in group if counts[items[i].synset] >= 2]
        if len({items[i].synset for i in group}) >= min_synsets:
            kept.append(group)
    return kept


def sense_nn(vectors: np.ndarray, items: list[Item], groups: list[list[int]],
             first_sense: dict[tuple[str, str], str]) -> tuple[dict[str, np.ndarray], int]:
    """Per-example 0/1 hits of 1-NN per layer and of the two sense baselines."""
    synsets = np.array([item.synset for item in items])
    scored: dict[str, list[float]] = defaultdict(list)
    for group in groups:
        g = np.array(group)
        for layer in range(vectors.shape[1]):
            unit = vectors[g, layer]
            unit = unit / np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
            similarity = unit @ unit.T
            np.fill_diagonal(similarity, -np.inf)
            nearest = g[similarity.argmax(axis=1)]
            scored[f"layer{layer}"].extend(synsets[nearest] == synsets[g])
        for k, i in enumerate(g):
            others = Counter(synsets[np.delete(g, k)])
            scored["most frequent sense (others)"].append(
                others.most_common(1)[0][0] == synsets[i])
            scored["WordNet first sense"].append(
                first_sense.get((items[i].lemma, items[i].pos)) == synsets[i])
    return {k: np.array(v, dtype=float) for k, v in scored.items()}, len(groups)


def summarise(scored: dict[str, np.ndarray], resamples: int, seed: int) -> dict[str, list]:
    n = len(next(iter(scored.values())))
    draws = bootstrap_draws(n, resamples, seed)
    out = {name: list(bootstrap_interval(v, draws)) for name, v in scored.items()}
    out["layer1 - layer2"] = list(bootstrap_interval(scored["layer1"] - scored["layer2"],
                                                     draws))
    return out


def common_options(parser: argparse.ArgumentParser, floor_help: str) -> None:
    """The options every layer probe script takes besides its data."""
    parser.add_argument("--random-floor", action="store_true", help=floor_help)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here too")


def model_runs(model_dirs: list[str], random_floor: bool) -> list[tuple[str, str, bool]]:
    """``(label, model_dir, random_weights)`` of each model scored, the first model's
    network with random weights last when ``random_floor``."""
    runs = [(m, m, False) for m in model_dirs]
    if random_floor:
        runs.append((f"{model_dirs[0]}, random weights", model_dirs[0], True))
    return runs


def interval_table(results: dict[str, dict[str, list[float]]]) -> str:
    """A markdown table: one column per run, one row per score, ``mean [low, high]``."""
    lines = ["| | " + " | ".join(results) + " |", "|---" * (1 + len(results)) + "|"]
    for row in next(iter(results.values())):
        lines.append(f"| {row} | " + " | ".join(
            f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in (results[r][row] for r in results))
            + " |")
    return "\n".join(lines)


def load_embedder(model_dir: str, random_weights: bool):
    import torch

    import elmo_model

    embedder = elmo_model.load_model_dir(model_dir, device="cpu")
    if random_weights:
        torch.manual_seed(0)
        embedder = elmo_model.ElmoEmbedder(elmo_model.BiLM(embedder.config).eval(),
                                           device="cpu")
    return embedder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--wordnet-dir", default="/usr/share/wordnet")
    parser.add_argument("--max-pos-items", type=int, default=4000,
                        help="examples drawn at random (fixed seed) for the POS probe")
    common_options(parser, "also score the same network with random weights")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    items, first_sense = read_wordnet(Path(args.wordnet_dir))
    rng = np.random.default_rng(args.seed)
    pos_items = [items[i] for i in rng.permutation(len(items))[: args.max_pos_items]]
    split = rng.permutation(len(pos_items))
    train, test = split[: len(split) // 2], split[len(split) // 2:]
    groups = sense_groups(items)
    sense_items = [items[i] for g in groups for i in g]
    groups = sense_groups(sense_items)
    print(f"WordNet: {len(items):,} example items; POS: {len(train):,} train / "
          f"{len(test):,} test; senses: {len(sense_items):,} examples of {len(groups):,} "
          f"lemma+POS ({time.perf_counter() - start:.0f}s)", flush=True)

    runs = [("trained", False)] + ([("random weights", True)] if args.random_floor else [])
    results: dict[str, dict] = {}
    for name, random_weights in runs:
        embedder = load_embedder(args.model_dir, random_weights)
        pos_vectors = target_vectors(embedder, pos_items)
        sense_vectors = target_vectors(embedder, sense_items)
        pos_scored = pos_probe(pos_vectors, pos_items, train, test)
        sense_scored, _ = sense_nn(sense_vectors, sense_items, groups, first_sense)
        results[name] = {"pos": summarise(pos_scored, args.resamples, args.seed),
                         "senses": summarise(sense_scored, args.resamples, args.seed)}
        print(f"{name}: {time.perf_counter() - start:.0f}s", flush=True)
    for task in ("pos", "senses"):
        print(f"\n{task} ({args.model_dir}): accuracy [95% bootstrap interval]")
        print(interval_table({run: rows[task] for run, rows in results.items()}))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
