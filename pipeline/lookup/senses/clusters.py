"""Sense clusters: every distinct context of a word, grouped by k-means.

    result = cluster_senses("data/ds-top.lance", ["union"], k="auto")

Clustering runs scikit-learn's k-means on the unit (cosine-geometry) vectors of every
distinct context of the words, centred on their mean; ``k="auto"`` picks the largest k in
2..8 whose silhouette is within ``AUTO_SILHOUETTE_SHARE`` of the best (``sense_kmeans``).
k-means was chosen over HDBSCAN by measuring both on the sample corpus (docs/senses.md).

Before clustering, the vectors of each written form are centred on their word's
(``centre="case"``, the default): *Union*, *UNION* and *union* are moved to the mean of
all three, so that what capitals alone explain (a sentence start, a title, a proper name
being capitalised) no longer splits the clusters, while *unions* keeps its own mean.
Measured on the State of the Union addresses, raw vectors split *union*, *bank* and
*state* by capitals (adjusted Rand index 0.97-0.99 with the case pattern), centred ones
did not (docs/senses.md). ``centre="forms"`` centres every written form on the word's
mean (plural too), ``centre="none"`` clusters the vectors as they are.

Each cluster is named by its most typical context words (words near the target that are
more frequent in it than in the other clusters) and its example nearest the centre;
``pipeline.lookup.senses.maps`` draws the result, ``pipeline.lookup.senses.tables`` counts
it by a document field and exports it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.doc_fields import Filters, as_filters
from pipeline.lookup.index.sense_index import RESULT_COLUMNS, SenseIndex, stem_words
from pipeline.lookup.layers.tokens import matrix
from pipeline.lookup.layers.vectors import unit_vectors
from pipeline.lookup.senses.hits import Hit, distinct_contexts, hits_from_table

MAX_CONTEXTS = 5_000  # clustered (and drawn) per word at most; more are sampled
CENTRINGS = ("case", "forms", "none")
# A written form is centred only with this many distinct contexts: the mean of fewer is
# mostly their own meaning, which centring would erase.
MIN_FORM_CONTEXTS = 3

# Context words: letters with inner apostrophes (the same regardless of tokenizer).
WORD_RE = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
CONTEXT_WINDOW = 6  # words either side of the occurrence
SENTENCE_ENDS = set(".!?;:")
# A content word names a cluster only if this share of its occurrences (and 2) have it:
# rarer ones are chance co-occurrences (measured on the sample: "chosen" for "the play").
MIN_WORD_SHARE = 0.05


def context_features(hit: Hit, window: int = CONTEXT_WINDOW) -> tuple[set[str], set[str]]:
    """``(phrases, words)`` around the occurrence: the word with the word touching it on
    each side (``the play``, ``play at``; ``(start) play`` first in a sentence; stop words
    kept, they tell a noun from a verb), and the lowercase content words within
    ``window`` words (stop words, one letter left out)."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    s = hit.sentence
    found = list(WORD_RE.finditer(s))
    before = [m for m in found if m.end() <= hit.start]
    after = [m for m in found if m.start() >= hit.end]
    word = s[hit.start:hit.end].lower()
    phrases = set()
    gap = s[before[-1].end():hit.start] if before else s[:hit.start]
    if before and not gap.strip():
        phrases.add(f"{before[-1].group().lower()} {word}")
    elif not before or gap.strip()[-1:] in SENTENCE_ENDS:  # "Play, sirs." / "No. Play on"
        phrases.add(f"(start) {word}")
    if after and not s[hit.end:after[0].start()].strip():
        phrases.add(f"{word} {after[0].group().lower()}")
    nearby = [m.group().lower() for m in before[-window:] + after[:window]]
    words = {w for w in nearby if len(w) > 1 and w not in ENGLISH_STOP_WORDS}
    return phrases, words


def typical(features: Sequence[set[str]], labels: np.ndarray, label: int, least: int,
            n: int = 3) -> list[str]:
    """The ``n`` features most typical of cluster ``label``: highest share of its
    occurrences minus their share of the other clusters' (at least ``least`` of its own)."""
    inside = np.flatnonzero(labels == label)
    outside = np.flatnonzero(labels != label)
    count_in = Counter(f for i in inside for f in features[i])
    count_out = Counter(f for i in outside for f in features[i])
    scores = {f: c / len(inside) - (count_out[f] / len(outside) if len(outside) else 0.0)
              for f, c in count_in.items() if c >= least}
    return sorted((f for f in scores if scores[f] > 0 or not len(outside)),
                  key=lambda f: (-scores[f], -count_in[f], f))[:n]


@dataclass
class SenseCluster:
    label: int
    size: int
    examples: list[Hit] = field(default_factory=list)  # nearest the centre first
    phrases: list[str] = field(default_factory=list)  # most typical neighbour phrases
    keywords: list[str] = field(default_factory=list)  # most typical content words

    def typical_text(self) -> str:
        """``"to play", "play the"; prostitute``: what names the sense."""
        parts = [", ".join(f'"{p}"' for p in self.phrases), ", ".join(self.keywords)]
        return "; ".join(p for p in parts if p) or "no typical context words"

    def name(self) -> str:
        """``sense 2 (100): "to play", "play the"; prostitute``."""
        return f"sense {self.label + 1} ({self.size}): {self.typical_text()}"


@dataclass
class ClusterResult:
    words: list[str]
    k: int
    silhouettes: dict[int, float]  # k -> mean silhouette, for every k tried
    clusters: list[SenseCluster]  # largest first; cluster i has label i
    labels: np.ndarray  # cluster of each point
    points: np.ndarray  # [n, 2] PCA projection of the unit vectors, for plotting
    occurrences: list[Hit]  # the occurrence of each point (one per distinct context)
    explained: tuple[float, float]  # variance share of the two plotted components
    mix: str = ""
    auto: bool = False  # k chosen by the auto rule (sense_kmeans)
    n_rows: int = 0  # occurrences in the index, repeated contexts included
    n_distinct: int = 0  # distinct contexts among them (more than clustered if sampled)
    centre: str = "case"  # how written forms were centred (CENTRINGS)
    filters: list[str] = field(default_factory=list)  # document-field filters, as given
    # Every occurrence (repeated contexts and any left out of a sample too) and its
    # cluster: the nearest centre, which for a clustered point is its own cluster.
    all_occurrences: list[Hit] = field(default_factory=list)
    all_labels: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # Each of those occurrences' cosine similarity to its cluster's centre.
    all_similarity: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    @property
    def silhouette(self) -> float | None:
        return self.silhouettes.get(self.k)


def form_offsets(x: np.ndarray, tokens: Sequence[str], centre: str = "case"
                 ) -> dict[str, np.ndarray]:
    """What to subtract from each written form's unit vectors ``x``: its mean minus its
    word's mean (``case``: the forms of one lowercase word) or all forms' mean
    (``forms``). Forms with fewer than ``MIN_FORM_CONTEXTS`` contexts are left as they are."""
    if centre not in CENTRINGS:
        raise ElmoUserError(f"centre must be one of {', '.join(CENTRINGS)}, not {centre!r}")
    if centre == "none":
        return {}
    forms = np.array(tokens, dtype=object)
    groups = np.array([t.lower() for t in tokens], dtype=object) if centre == "case" \
        else np.zeros(len(tokens), dtype=object)
    offsets = {}
    for form in set(tokens):
        rows = forms == form
        if rows.sum() >= MIN_FORM_CONTEXTS:
            word = groups == groups[np.flatnonzero(rows)[0]]
            offsets[form] = x[rows].mean(0) - x[word].mean(0)
    return offsets


def centred(x: np.ndarray, tokens: Sequence[str], offsets: dict[str, np.ndarray]
            ) -> np.ndarray:
    """Unit vectors ``x`` with their form's offset taken away, unit length again."""
    if not offsets:
        return x
    shift = np.stack([offsets.get(t, np.zeros(x.shape[1], x.dtype)) for t in tokens])
    return unit_vectors(x - shift)


# --k auto: the largest k in 2..max_k whose silhouette is within this share of the best
# one. Silhouettes of ELMo uses are flat across k and peak at 2-3 where the gold senses
# are finer. Measured against gold senses (bench/sense_k.py, BENCHMARKS.md), adjusted
# Rand index, the best silhouette on the vectors as stored -> this rule on centred ones:
# Senseval 0.146 -> 0.153, WordNet examples 0.083 -> 0.110; the two sets' mean 0.132,
# above every fixed k (best: k=4, 0.128 centred, 0.131 as stored).
AUTO_SILHOUETTE_SHARE = 0.2


@dataclass
class SenseSplit:
    """One clustering of unit vectors: ``sense_kmeans``'s answer."""

    labels: np.ndarray  # [n] cluster of each vector, 0..k-1
    centres: np.ndarray  # [k, dim] k-means centres, in the clustered (placed) geometry
    k: int
    scores: dict[int, float]  # k -> silhouette, for every k tried
    origin: np.ndarray  # [dim] the mean the vectors were centred on (``place``)

    def place(self, x: np.ndarray) -> np.ndarray:
        """Unit vectors ``x`` as they were clustered: centred on the clustered uses' mean,
        unit length again (what is shared by all uses of a word says nothing of which
        sense it is; measured: more agreement with gold senses at every k)."""
        return unit_vectors(x - self.origin)


def _kmeans(x: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.cluster import KMeans

    model = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(x)
    return model.labels_.astype(np.int64), model.cluster_centers_


def _silhouette(x: np.ndarray, labels: np.ndarray, seed: int, sample: int) -> float:
    from sklearn.metrics import silhouette_score

    # Sampled: silhouette costs O(n^2).
    return float(silhouette_score(x, labels, sample_size=min(len(x), sample),
                                  random_state=seed))


def sense_kmeans(x: np.ndarray, k: int | str = "auto", max_k: int = 8, seed: int = 0,
                 sample: int = 2000) -> SenseSplit:
    """Sense clusters of unit vectors ``x`` (one row per distinct context): scikit-learn's
    k-means, on the vectors centred on their mean (``SenseSplit.place``), with ``k``
    clusters, or with ``k="auto"`` the largest k in 2..``max_k`` whose silhouette is
    within ``AUTO_SILHOUETTE_SHARE`` of the best; one cluster when there are too few
    vectors to split. ``elmo senses cluster``, the one-word view and ``senses change``'s
    ``jsd`` all cluster with this."""
    n = len(x)
    origin = x.mean(0) if n > 1 else np.zeros(x.shape[1], x.dtype)
    placed = unit_vectors(x - origin)
    if k != "auto":
        chosen = int(k)
        if not 1 <= chosen <= n:
            raise SettingError("k", lambda name: (
                f"{name('k')} must be between 1 and the {n} distinct contexts"))
        labels, centres = _kmeans(placed, chosen, seed)
        return SenseSplit(labels, centres, chosen, {}, origin)
    scores: dict[int, float] = {}
    splits: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for kk in range(2, min(max_k, n - 1) + 1):
        labels, centres = _kmeans(placed, kk, seed)
        if len(set(labels.tolist())) > 1:
            scores[kk] = _silhouette(placed, labels, seed, sample)
            splits[kk] = labels, centres
    if not scores:
        return SenseSplit(np.zeros(n, np.int64), placed.mean(0, keepdims=True), 1, scores,
                          origin)
    best = max(scores.values())
    enough = best - AUTO_SILHOUETTE_SHARE * abs(best)
    chosen = max(kk for kk, score in scores.items() if score >= enough)
    return SenseSplit(*splits[chosen], chosen, scores, origin)


def _name_clusters(occurrences: list[Hit], labels: np.ndarray, k: int, words: Sequence[str],
                   examples: int) -> list[SenseCluster]:
    features = [context_features(h) for h in occurrences]
    phrases = [f[0] for f in features]
    # Other forms of the words are no news about which sense a cluster is.
    stems = set(stem_words(words))
    content = [{w for w in f[1] if stem_words([w])[0] not in stems} for f in features]
    clusters = []
    for label in range(k):
        members = np.flatnonzero(labels == label)
        near = members[np.argsort([-occurrences[i].similarity for i in members], kind="stable")]
        least = max(2, round(MIN_WORD_SHARE * len(members)))
        clusters.append(SenseCluster(
            label, len(members), [occurrences[i] for i in near[:examples]],
            typical(phrases, labels, label, least=2, n=2),
            typical(content, labels, label, least=least, n=3)))
    return clusters


def sense_count(text: str) -> int | str:
    """A number of senses as a user writes it: a whole number, or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise SettingError("k", lambda n: f"{n('k')} must be a number or auto, not {text!r}"
                           ) from None


def cluster_senses(index: str | SenseIndex, words: Sequence[str], k: int | str = "auto",
                   examples: int = 3, max_k: int = 8, seed: int = 0, sample: int = 2000,
                   max_contexts: int = MAX_CONTEXTS, *, filters: Filters = None,
                   centre: str = "case") -> ClusterResult:
    """Cluster the distinct contexts of ``words`` (lowercase match) into senses: all of
    them up to ``max_contexts``, else that many drawn at random (``seed``); the
    silhouette is estimated on ``sample`` of them. ``filters``: only occurrences in
    documents whose fields pass (``doc_fields.as_filters``); ``centre``: how written
    forms are centred first (``CENTRINGS``, see the module's docstring)."""
    from sklearn.decomposition import PCA

    if not words:
        raise ElmoUserError("name at least one word to cluster")
    if examples < 0 or max_k < 2:
        raise SettingError("examples" if examples < 0 else "max_k", lambda name: (
            f"{name('examples')} must be at least 0 and {name('max_k')} at least 2"))
    if centre not in CENTRINGS:
        raise ElmoUserError(f"centre must be one of {', '.join(CENTRINGS)}, not {centre!r}")
    ix = index if isinstance(index, SenseIndex) else SenseIndex(index)
    conditions = as_filters(filters)
    table = ix.occurrences(words, columns=RESULT_COLUMNS,
                           where=ix.fields_where(conditions) if conditions else None)
    n_rows = table.num_rows
    rows = hits_from_table(table.drop_columns(["vector"]).append_column(
        "_distance", _zeros(n_rows)), ix.documents())
    keep = distinct_contexts(rows)
    n_distinct = len(keep)
    if n_distinct > max_contexts:
        # A map of more dots than this is unreadable, and its HTML tens of megabytes.
        pick = np.random.default_rng(seed).choice(n_distinct, max_contexts, replace=False)
        keep = [keep[i] for i in np.sort(pick)]
    n = len(keep)
    if n < 2:
        shown = f" in documents with {' '.join(c.describe() for c in conditions)}" \
            if conditions else " in the index"
        raise ElmoUserError(f"{' / '.join(words)}: {n} distinct context(s){shown}; "
                            "need at least 2 to cluster")
    every = unit_vectors(matrix(table.column("vector")))  # cosine geometry
    tokens = [h.token for h in rows]
    offsets = form_offsets(every[keep], [tokens[i] for i in keep], centre)
    every = centred(every, tokens, offsets)
    x = every[keep]
    split = sense_kmeans(x, k, max_k, seed, sample)
    chosen, scores, labels, centres = split.k, split.scores, split.labels, split.centres
    x, every = split.place(x), split.place(every)  # as clustered
    if chosen not in scores and 1 < len(set(labels.tolist())) < n:
        scores[chosen] = _silhouette(x, labels, seed, sample)
    # Largest cluster first, labelled 0..k-1.
    order = np.argsort(-np.bincount(labels, minlength=chosen), kind="stable")
    centres = centres[order]
    relabel = np.empty(chosen, np.int64)
    relabel[order] = np.arange(chosen)
    labels = relabel[labels]
    # Every occurrence to its nearest centre (k-means' own rule, so clustered points keep
    # their cluster); repeated and unsampled contexts get one too.
    all_labels = np.argmin((centres ** 2).sum(1)[None, :] - 2 * every @ centres.T, axis=1)
    all_labels[keep] = labels
    unit_centres = unit_vectors(centres)
    occurrences = [rows[i] for i in keep]
    for hit, sim in zip(occurrences, (x * unit_centres[labels]).sum(1), strict=True):
        hit.similarity = float(sim)  # to its cluster's centre
    clusters = _name_clusters(occurrences, labels, chosen, words, examples)
    pca = PCA(n_components=min(2, n, x.shape[1]), random_state=seed).fit(x)
    points = pca.transform(x)
    explained = [float(v) for v in pca.explained_variance_ratio_]
    if points.shape[1] < 2:
        points, explained = np.c_[points, np.zeros(n)], [*explained, 0.0]
    return ClusterResult(list(words), chosen, scores, clusters, labels, points, occurrences,
                         (explained[0], explained[1]), ix.meta.mix_name, k == "auto",
                         n_rows, n_distinct, centre, [c.describe() for c in conditions],
                         rows, all_labels.astype(np.int64),
                         (every * unit_centres[all_labels]).sum(1).astype(np.float32))


def _zeros(n: int) -> Any:
    import pyarrow as pa

    return pa.array(np.zeros(n), pa.float64())
