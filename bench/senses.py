"""Sense clustering on a real index: k-means + silhouette (what `elmo senses cluster` runs)
against HDBSCAN, the density method scikit-learn ships.

    .venv/bin/python bench/senses.py runs/demo/index
    .venv/bin/python bench/senses.py runs/demo/index --words play kind like well

For each word, on the unit vectors of its distinct contexts (what ``cluster_senses``
clusters): clusters found, share of points left as noise, mean silhouette (cosine, noise
left out), seconds, and agreement (adjusted Rand index) with a crude reference: the word
class its left neighbour implies (``the play`` noun, ``to play`` verb, ``very kind``
adjective/predicate; occurrences with any other left neighbour are left out of the ARI).
The reference only approximates senses, but it is independent of the vectors.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pipeline.lookup.index import RESULT_COLUMNS, SenseIndex
from pipeline.lookup.mixes import fsl_to_numpy
from pipeline.lookup.senses import WORD_RE, distinct_contexts, hits_from_table

NOUN_BEFORE = frozenset({"the", "a", "an", "this", "that", "his", "her", "my", "your", "our",
                         "their", "its", "no", "any", "some", "every", "what", "which", "whose",
                         "such"})
VERB_BEFORE = frozenset({"to", "will", "would", "shall", "should", "can", "could", "may", "might",
                         "must", "not", "i", "we", "you", "they", "did", "do", "does", "let"})
ADJ_BEFORE = frozenset({"very", "so", "too", "how", "as", "most", "more", "is", "was", "be", "are",
                        "were", "been", "am"})


def reference_class(sentence: str, start: int) -> str | None:
    before = [m.group().lower() for m in WORD_RE.finditer(sentence) if m.end() <= start]
    if not before:
        return None
    word = before[-1]
    for name, words in (("noun", NOUN_BEFORE), ("verb", VERB_BEFORE), ("adj", ADJ_BEFORE)):
        if word in words:
            return name
    return None


def vectors_of(ix: SenseIndex, word: str) -> tuple[np.ndarray, list[str | None]]:
    table = ix.occurrences([word], columns=RESULT_COLUMNS)
    table = table.append_column("_distance", table.column("tok_idx").cast("float64"))
    hits = hits_from_table(table.drop_columns(["vector"]))
    keep = distinct_contexts(hits)
    x = fsl_to_numpy(table.column("vector")).astype(np.float32)[keep]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, [reference_class(hits[i].sentence, hits[i].start) for i in keep]


def scores(x: np.ndarray, labels: np.ndarray, reference: list[str | None]) -> tuple[float, float]:
    from sklearn.metrics import adjusted_rand_score, silhouette_score

    clustered = labels >= 0
    sil = float("nan")
    if len(set(labels[clustered].tolist())) > 1:
        sil = float(silhouette_score(x[clustered], labels[clustered], metric="cosine"))
    known = [i for i, r in enumerate(reference) if r is not None]
    ari = adjusted_rand_score([reference[i] for i in known], labels[known])
    return sil, float(ari)


def main() -> None:
    from sklearn.cluster import HDBSCAN, KMeans
    from sklearn.metrics import silhouette_score

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index")
    parser.add_argument("--words", nargs="+", default=["play", "kind", "like", "well", "light",
                                                       "fair"])
    args = parser.parse_args()
    ix = SenseIndex(args.index)
    print("| word | n (ref) | method | clusters | noise | silhouette | ARI vs ref | s |")
    print("|---|---|---|---|---|---|---|---|")
    for word in args.words:
        x, reference = vectors_of(ix, word)
        n, n_ref = len(x), sum(r is not None for r in reference)
        t0 = time.perf_counter()
        best, best_k = -1.0, 0
        for k in range(2, min(8, n - 1) + 1):
            labels = KMeans(n_clusters=k, n_init=4, random_state=0).fit_predict(x)
            s = float(silhouette_score(x, labels))
            if s > best:
                best, best_k, best_labels = s, k, labels
        seconds = time.perf_counter() - t0
        sil, ari = scores(x, best_labels, reference)
        print(f"| {word} | {n} ({n_ref}) | k-means, k by silhouette | {best_k} | 0% | "
              f"{sil:.3f} | {ari:.2f} | {seconds:.2f} |")
        for size in (5, 10):
            t0 = time.perf_counter()
            labels = HDBSCAN(min_cluster_size=size, copy=True).fit_predict(x)
            seconds = time.perf_counter() - t0
            sil, ari = scores(x, labels, reference)
            found = len(set(labels.tolist()) - {-1})
            print(f"| {word} | {n} ({n_ref}) | HDBSCAN min_cluster_size={size} | {found} | "
                  f"{np.mean(labels < 0):.0%} | {sil:.3f} | {ari:.2f} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
