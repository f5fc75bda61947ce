"""How many senses should ``--k auto`` find? Auto-k against every fixed k, scored by
agreement with gold senses (adjusted Rand index, and purity), on two sense-tagged sets
never in the training corpora:

- Senseval's "line", "hard", "serve" and "interest" as NLTK ships it (3-6 senses a
  word; ``bench/sense_probe_senseval.py`` reads it): ``--per-word`` contexts of each word
  drawn at random (fixed seed);
- WordNet 3.0's gloss examples (``apt-get install wordnet-base``; ``bench/layer_probe.py``
  reads them): every (lemma, part of speech) with at least ``--min-examples`` examples
  in synsets that have two or more of them.

    # NLTK's package, from the nltk_data repository (packages/corpora/senseval.zip)
    unzip senseval.zip -d /tmp/nltk
    PYTHONPATH=$PWD:bench .venv/bin/python bench/sense_k.py models/default \\
        --senseval-dir /tmp/nltk/senseval --cache /tmp/sense_k.npz

Each context is embedded with the model (its own start), the target word's vector taken
from the ``top`` layer (the mix the README builds indexes with), made unit length and
centred by written form as ``elmo senses cluster`` does (``clusters.form_offsets``), then
clustered by ``clusters.sense_kmeans`` once per fixed k in 2..8 and once with
``k="auto"``; and, for before/after, as they were clustered before (k-means on the
vectors as they are, auto = the best silhouette). A word with fewer contexts than a k
needs (``n <= k``) is scored at its largest possible k. Purity is printed too, but it
grows with k whatever the clusters are: the ARI is the score.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

FIXED_KS = tuple(range(2, 9))


def load_vectors(args: argparse.Namespace) -> dict[str, tuple[np.ndarray, list[str], list[str]]]:
    """``{set/word: (vectors [n, dim] top layer, written forms, gold senses)}``, cached."""
    from layer_probe import load_embedder, read_wordnet, sense_groups
    from layer_probe import target_vectors as wordnet_vectors
    from sense_probe_senseval import read_senseval
    from sense_probe_senseval import target_vectors as senseval_vectors

    cache = Path(args.cache) if args.cache else None
    if cache and cache.exists():
        data = np.load(cache, allow_pickle=True)
        return data["words"].item()
    embedder = load_embedder(args.model_dir, False)
    words: dict[str, tuple[np.ndarray, list[str], list[str]]] = {}
    rng = np.random.default_rng(args.seed)
    if args.senseval_dir:
        contexts = read_senseval(Path(args.senseval_dir))
        by_word: dict[str, list] = defaultdict(list)
        for c in contexts:
            by_word[c.word].append(c)
        for word, found in sorted(by_word.items()):
            pick = rng.permutation(len(found))[: args.per_word]
            chosen = [found[i] for i in sorted(pick)]
            vectors = senseval_vectors(embedder, chosen)[:, -1]
            words[f"senseval/{word}"] = (vectors, [c.words[c.position] for c in chosen],
                                         [c.sense for c in chosen])
            print(f"senseval {word}: {len(chosen)} contexts", flush=True)
    if args.wordnet_dir and Path(args.wordnet_dir).exists():
        items, _ = read_wordnet(Path(args.wordnet_dir))
        groups = [g for g in sense_groups(items) if len(g) >= args.min_examples]
        flat = [items[i] for g in groups for i in g]
        vectors = wordnet_vectors(embedder, flat)[:, -1]
        start = 0
        for g in groups:
            part = flat[start:start + len(g)]
            words[f"wordnet/{part[0].lemma}.{part[0].pos}"] = (
                vectors[start:start + len(g)], [it.sentence[it.position] for it in part],
                [it.synset for it in part])
            start += len(g)
        print(f"wordnet: {len(groups)} lemmas, {len(flat)} examples", flush=True)
    if cache:
        np.savez(cache, words=np.array(words, dtype=object))
    return words


def purity(gold: np.ndarray, labels: np.ndarray) -> float:
    """Share of contexts whose cluster's most common gold sense is their own."""
    return sum(Counter(gold[labels == c]).most_common(1)[0][1]
               for c in np.unique(labels)) / len(gold)


def prepared(vectors: np.ndarray, forms: list[str]) -> np.ndarray:
    """Unit vectors centred by written form, as ``cluster_senses`` clusters them."""
    from pipeline.lookup.layers.vectors import unit_vectors
    from pipeline.lookup.senses.clusters import centred, form_offsets

    x = unit_vectors(vectors.astype(np.float32))
    return centred(x, forms, form_offsets(x, forms, "case"))


def before_kmeans(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """The clustering before this bench: k-means on the vectors as they are."""
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=k, n_init=4, random_state=seed).fit(x).labels_


def before_auto(x: np.ndarray, max_k: int, seed: int) -> np.ndarray:
    """The auto rule before this bench: the best silhouette over k in 2..max_k."""
    from sklearn.metrics import silhouette_score

    best, best_score = np.zeros(len(x), np.int64), -np.inf
    for k in range(2, min(max_k, len(x) - 1) + 1):
        labels = before_kmeans(x, k, seed)
        if len(set(labels.tolist())) > 1:
            score = silhouette_score(x, labels, sample_size=min(len(x), 2000), random_state=seed)
            if score > best_score:
                best, best_score = labels, score
    return best


def clusterings() -> dict[str, dict[str, Callable[[np.ndarray, int], np.ndarray]]]:
    """``{version: {column: labels of x with seed}}``: before and now, each fixed k and
    auto."""
    from pipeline.lookup.senses.clusters import sense_kmeans

    def fixed(cluster: Callable, k: int) -> Callable[[np.ndarray, int], np.ndarray]:
        return lambda x, seed: cluster(x, min(k, len(x) - 1), seed)

    now = lambda x, k, seed: sense_kmeans(x, k, seed=seed).labels  # noqa: E731
    return {
        "before (as stored, best silhouette)": {
            **{f"k={k}": fixed(before_kmeans, k) for k in FIXED_KS},
            "auto": lambda x, seed: before_auto(x, 8, seed)},
        "now (sense_kmeans: centred, within 20% of the best silhouette)": {
            **{f"k={k}": fixed(now, k) for k in FIXED_KS},
            "auto": lambda x, seed: sense_kmeans(x, "auto", 8, seed).labels}}


def table(title: str, scores: dict[str, dict[str, float]], chosen: dict[str, int],
          words: dict) -> list[str]:
    """Markdown: Senseval words, then each set's mean, then the two sets' mean."""
    columns = list(next(iter(scores.values())))
    lines = [f"{title}", "", "| word (contexts, senses) | " + " | ".join(columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    for name in scores:
        if name.startswith("senseval/"):
            senses = words[name][2]
            cells = [f"{scores[name][c]:.3f}" + (f" (k={chosen[name]})" if c == "auto" else "")
                     for c in columns]
            lines.append(f"| {name} ({len(senses)}, {len(set(senses))}) | "
                         + " | ".join(cells) + " |")
    set_means = []
    for group in ("senseval/", "wordnet/"):
        names = [n for n in scores if n.startswith(group)]
        if names:
            set_means.append([float(np.mean([scores[n][c] for n in names])) for c in columns])
            lines.append(f"| {group} mean of {len(names)} words | "
                         + " | ".join(_marked(set_means[-1])) + " |")
    if len(set_means) == 2:
        lines.append("| mean of the two sets | "
                     + " | ".join(_marked(list(np.mean(set_means, axis=0)))) + " |")
    return lines


def _marked(means: list[float]) -> list[str]:
    """Bold where at least the best fixed k (all columns but the last, auto)."""
    best = max(means[:-1])
    return [f"**{m:.3f}**" if m >= best - 1e-12 else f"{m:.3f}" for m in means]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--senseval-dir", help="the unzipped folder with line.pos, hard.pos...")
    parser.add_argument("--wordnet-dir", default="/usr/share/wordnet")
    parser.add_argument("--per-word", type=int, default=400,
                        help="Senseval contexts per word, drawn at random")
    parser.add_argument("--min-examples", type=int, default=10,
                        help="WordNet (lemma, POS) groups with at least this many examples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", help="an .npz to keep the vectors in between runs")
    args = parser.parse_args()
    import torch
    from sklearn.metrics import adjusted_rand_score

    torch.set_num_threads(1)
    start = time.perf_counter()
    words = load_vectors(args)
    print(f"vectors: {time.perf_counter() - start:.0f}s", flush=True)
    for version, columns in clusterings().items():
        ari: dict[str, dict[str, float]] = {}
        pur: dict[str, dict[str, float]] = {}
        chosen: dict[str, int] = {}
        for name, (vectors, forms, senses) in words.items():
            x = prepared(vectors, forms)
            gold = np.array(senses)
            ari[name], pur[name] = {}, {}
            for column, cluster in columns.items():
                labels = cluster(x, args.seed)
                ari[name][column] = adjusted_rand_score(gold, labels)
                pur[name][column] = purity(gold, labels)
            chosen[name] = len(np.unique(labels))  # the last column's: auto
        print(f"\n{version}: {time.perf_counter() - start:.0f}s\n")
        print("\n".join(table("adjusted Rand index with gold senses", ari, chosen, words)))
        print()
        print("\n".join(table("purity", pur, chosen, words)))
        counts = Counter(chosen[n] for n in chosen if n.startswith("wordnet/"))
        print("\nauto's k on the WordNet lemmas: "
              + ", ".join(f"{k}: {c}" for k, c in sorted(counts.items())))


if __name__ == "__main__":
    main()
