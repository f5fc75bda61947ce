"""Contextual word senses: nearest occurrences of a word in context, and sense clusters.

    hits = search_senses("data/ds-top.lance", "He plays the guitar in a band", "plays", k=10)
    result = cluster_senses("data/ds-top.lance", ["play"], k="auto")

Search tokenizes the query sentence with the dataset's tokenizer (recorded in its
descriptor), embeds it with the dataset's own model (found from the descriptor, or given
with ``model_dir`` and checked against its fingerprint), rounds the layers to the
dataset's storage dtype as stored vectors were, mixes them with the index's mix, and asks
the index for the nearest tokens by cosine. By default only occurrences of the same word
count, in any of its forms (``match="forms"``: the index's Snowball stems, so *plays*
finds *play*, *played*, *playing*); ``match="word"`` keeps only the exact word (any case)
and ``match="any"`` every token. A context that occurs twice (the same sentence text
around the same token, e.g. a corpus repeating a passage) is listed once.

Clustering runs scikit-learn's k-means on the unit (cosine-geometry) vectors of every
distinct context of the words; ``k="auto"`` picks the k in 2..8 with the best silhouette.
k-means was chosen over HDBSCAN by measuring both on the sample corpus (docs/senses.md).
Each cluster is named by its most typical context words (words near the target that are
more frequent in it than in the other clusters) and its example nearest the centre;
``pipeline.lookup.sense_maps`` draws the result.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index import RESULT_COLUMNS, SenseIndex, stem_words
from schemas.layers import as_stored

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.tokenize import Tokenizer
    from schemas import DatasetDescriptor

MATCHES = ("forms", "word", "any")
# A search fetches this many times k first, and more while duplicates leave it short.
FETCH_FACTOR = 2
MAX_FETCH = 10_000
MAX_CONTEXTS = 5_000  # clustered (and drawn) per word at most; more are sampled


@dataclass
class Hit:
    rank: int
    similarity: float  # cosine similarity, 1 - LanceDB's cosine distance
    token: str
    doc_id: str
    sent_idx: int
    tok_idx: int
    sentence: str
    start: int
    end: int

    def highlighted(self, left: str = "[", right: str = "]") -> str:
        s = self.sentence
        if 0 <= self.start <= self.end <= len(s):
            return f"{s[:self.start]}{left}{s[self.start:self.end]}{right}{s[self.end:]}"
        return s

    def snippet(self, width: int = 70, left: str = "[", right: str = "]") -> str:
        """About ``width`` characters of the sentence around the word, the word marked."""
        s = self.sentence
        if not 0 <= self.start <= self.end <= len(s):
            return s[:width]
        side = max(10, (width - (self.end - self.start)) // 2)
        lo, hi = max(0, self.start - side), min(len(s), self.end + side)
        # Cut at spaces, so that no word is shown in part.
        if lo > 0:
            cut = s.find(" ", lo, self.start)
            lo = cut + 1 if cut >= 0 else lo
        if hi < len(s):
            cut = s.rfind(" ", self.end, hi)
            hi = cut if cut >= 0 else hi
        text = f"{s[lo:self.start]}{left}{s[self.start:self.end]}{right}{s[self.end:hi]}"
        return f"{'…' if lo > 0 else ''}{' '.join(text.split())}{'…' if hi < len(s) else ''}"

    @property
    def context(self) -> tuple[str, ...]:
        """What makes two occurrences the same context: the sentence text (whitespace
        normalised) and the token's place in it. Without sentence text (a dataset that
        stores none) nothing says two are the same: the occurrence is its own context."""
        text = " ".join(self.sentence.split())
        if not text:
            return "", self.doc_id, str(self.sent_idx), str(self.tok_idx)
        return text, str(self.tok_idx)


@dataclass
class QueryToken:
    tokens: list[str]
    position: int

    @property
    def word(self) -> str:
        return self.tokens[self.position]


def hits_from_table(table: pa.Table) -> list[Hit]:
    rows = table.to_pylist()
    return [Hit(rank=i + 1, similarity=1.0 - float(r["_distance"]), token=r["token"],
                doc_id=r["doc_id"], sent_idx=r["sent_idx"], tok_idx=r["tok_idx"],
                sentence=r["sentence"], start=r["start"], end=r["end"])
            for i, r in enumerate(rows)]


def dataset_tokenizer(descriptor: DatasetDescriptor) -> Tokenizer:
    """The tokenizer the dataset recorded: a query must be split the way the corpus was."""
    from pipeline.tokenize import get_tokenizer, tokenizer_names

    name = (descriptor.tokenizer or {}).get("name")
    if not name:
        raise ElmoUserError("the dataset does not record its tokenizer, so a query sentence "
                            "cannot be split like its text; re-embed it with this version")
    if name not in tokenizer_names():
        raise ElmoUserError(f"the dataset was tokenized with {name!r}, which this elmo-store "
                            f"does not know (it knows {', '.join(tokenizer_names())}); use "
                            "the elmo-store version that wrote it")
    return get_tokenizer(name)


def locate_word(sentence: str, word: str, occurrence: int = 1, *,
                tokenizer: Tokenizer) -> QueryToken:
    """Tokenize ``sentence`` with ``tokenizer`` and find ``word``: the same text, else in
    any case, else the same stem (``--word play`` finds *plays*)."""
    if occurrence < 1:
        raise ElmoUserError(f"--occurrence must be at least 1, not {occurrence}")
    tokens = [t.text for s in tokenizer.split_sentences(sentence) for t in s.tokens]
    if not tokens:
        raise ElmoUserError("the query sentence has no tokens")
    stem = stem_words([word])[0]
    stems = stem_words(tokens)
    for same in (lambda i: tokens[i] == word, lambda i: tokens[i].lower() == word.lower(),
                 lambda i: stems[i] == stem):
        found = [i for i in range(len(tokens)) if same(i)]
        if found:
            if occurrence > len(found):
                raise ElmoUserError(f"{word!r} occurs {len(found)} time(s) in the sentence; "
                                    f"--occurrence {occurrence} is out of range")
            return QueryToken(tokens, found[occurrence - 1])
    raise ElmoUserError(f"word {word!r} is not in the sentence (its tokens: "
                        f"{' '.join(tokens)})")


def model_files_for(descriptor: DatasetDescriptor,
                    model_dir: str | None = None) -> tuple[Path, Path]:
    """The dataset's model files ``(options, weights)``: from ``model_dir`` if given, else
    the paths the descriptor recorded; either way the fingerprint must match the dataset's."""
    import elmo_model

    if model_dir is not None:
        directory = Path(model_dir)
        options_path = directory / elmo_model.OPTIONS_FILE
        if not options_path.is_file():
            raise ElmoUserError(f"model not found at {directory} (no "
                                f"{elmo_model.OPTIONS_FILE}); pass --model DIR")
        weights = elmo_model.find_weights(directory)
    else:
        recorded = descriptor.model.get("options")
        if not recorded:
            raise ElmoUserError("the dataset does not record its model's location; "
                                "pass --model DIR")
        options_path = Path(recorded)
        # Datasets written before the weights path was recorded: the usual file names.
        weights_recorded = descriptor.model.get("weights")
        if not options_path.is_file() or (weights_recorded
                                          and not Path(weights_recorded).is_file()):
            raise ElmoUserError(f"the dataset's model is no longer at {options_path.parent}; "
                                "pass --model DIR")
        weights = (Path(weights_recorded) if weights_recorded
                   else elmo_model.find_weights(options_path.parent))
    if elmo_model.model_fingerprint(options_path, weights) != descriptor.model_fingerprint:
        raise ElmoUserError(f"the model at {options_path.parent} is not the one that embedded "
                            "this dataset (fingerprint differs); pass the right --model DIR")
    return options_path, weights


def embed_query(index: SenseIndex, query: QueryToken, model_dir: str | None = None,
                embedder: Any = None, descriptor: DatasetDescriptor | None = None
                ) -> np.ndarray:
    """The query token's mixed vector, computed as the stored vectors were."""
    import elmo_model
    from pipeline.lookup.dataset import read_dataset_descriptor
    from pipeline.lookup.mixes import mix_arrays

    if descriptor is None:
        descriptor = read_dataset_descriptor(index.meta.dataset)
    if embedder is None:
        options, weights = model_files_for(descriptor, model_dir)
        embedder = elmo_model.load(options, weights, mode="stateless", device="auto")
    layers = embedder.embed([query.tokens])[0][:, query.position, :]  # [L+1, 2P]
    # Round like the stored rows, so that a sentence from the corpus finds itself at 0.
    rows = [as_stored(layers[k][None, :], descriptor.dtype) for k in range(layers.shape[0])]
    return mix_arrays(rows, index.mix)[0]


def distinct_contexts(hits: Sequence[Hit]) -> list[int]:
    """Positions of the first hit of each context (see ``Hit.context``), in order."""
    seen: set[tuple[str, ...]] = set()
    keep = []
    for i, hit in enumerate(hits):
        if hit.context not in seen:
            seen.add(hit.context)
            keep.append(i)
    return keep


def nearest_distinct(index: SenseIndex, vector: np.ndarray, k: int,
                     words: Sequence[str] | None = None, forms: bool = False,
                     exact: bool = False) -> list[Hit]:
    """The ``k`` nearest occurrences with no context twice: asks the index for more
    rows while repeated contexts leave fewer than ``k`` distinct ones."""
    if k < 1:
        raise ElmoUserError("-k must be at least 1")
    fetch = min(MAX_FETCH, max(k * FETCH_FACTOR, k + 8))
    while True:
        hits = hits_from_table(index.search(vector, k=fetch, words=words, exact=exact,
                                            forms=forms))
        keep = distinct_contexts(hits)[:k]
        if len(keep) == k or len(hits) < fetch or fetch >= MAX_FETCH:
            break
        fetch = min(MAX_FETCH, fetch * 4)
    distinct = [hits[i] for i in keep]
    for rank, hit in enumerate(distinct, 1):
        hit.rank = rank
    return distinct


def search_senses(index: str | SenseIndex, sentence: str, word: str, k: int = 10,
                  match: str = "forms", occurrence: int = 1, model_dir: str | None = None,
                  embedder: Any = None, exact: bool = False) -> list[Hit]:
    """Occurrences nearest in meaning to ``word`` as used in ``sentence``.

    ``match``: ``forms`` (default: the same word in any of its forms), ``word`` (the same
    word, any case) or ``any`` (every token)."""
    from pipeline.lookup.dataset import read_dataset_descriptor

    if match not in MATCHES:
        raise ElmoUserError(f"match must be one of {', '.join(MATCHES)}, not {match!r}")
    if k < 1:
        raise ElmoUserError("-k must be at least 1")
    ix = index if isinstance(index, SenseIndex) else SenseIndex(index)
    if match == "forms":
        ix.require_stems()  # before the model loads: the fix is a rebuild
    descriptor = read_dataset_descriptor(ix.meta.dataset)
    query = locate_word(sentence, word, occurrence,
                        tokenizer=dataset_tokenizer(descriptor))
    vector = embed_query(ix, query, model_dir, embedder, descriptor)
    words = None if match == "any" else [query.word]
    return nearest_distinct(ix, vector, k, words=words, forms=match == "forms", exact=exact)


# --------------------------------------------------------------------------- clustering

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

    def name(self) -> str:
        """``sense 2 (100): "to play", "play the"; prostitute``."""
        parts = [", ".join(f'"{p}"' for p in self.phrases), ", ".join(self.keywords)]
        typical_text = "; ".join(p for p in parts if p) or "no typical context words"
        return f"sense {self.label + 1} ({self.size}): {typical_text}"


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
    auto: bool = False  # k chosen by silhouette
    n_rows: int = 0  # occurrences in the index, repeated contexts included
    n_distinct: int = 0  # distinct contexts among them (more than clustered if sampled)

    @property
    def silhouette(self) -> float | None:
        return self.silhouettes.get(self.k)


def _kmeans(x: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.cluster import KMeans

    model = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(x)
    return model.labels_.astype(np.int64), model.cluster_centers_


def cluster_senses(index: str | SenseIndex, words: Sequence[str], k: int | str = "auto",
                   examples: int = 3, max_k: int = 8, seed: int = 0, sample: int = 2000,
                   max_contexts: int = MAX_CONTEXTS) -> ClusterResult:
    """Cluster the distinct contexts of ``words`` (lowercase match) into senses: all of
    them up to ``max_contexts``, else that many drawn at random (``seed``); the
    silhouette is estimated on ``sample`` of them."""
    from sklearn.decomposition import PCA
    from sklearn.metrics import silhouette_score

    from pipeline.lookup.mixes import fsl_to_numpy

    if not words:
        raise ElmoUserError("name at least one word to cluster")
    if examples < 0 or max_k < 2:
        raise ElmoUserError("--examples must be at least 0 and max_k at least 2")
    ix = index if isinstance(index, SenseIndex) else SenseIndex(index)
    table = ix.occurrences(words, columns=RESULT_COLUMNS)
    n_rows = table.num_rows
    rows = hits_from_table(table.drop_columns(["vector"]).append_column(
        "_distance", _zeros(n_rows)))
    keep = distinct_contexts(rows)
    n_distinct = len(keep)
    if n_distinct > max_contexts:
        # A map of more dots than this is unreadable, and its HTML tens of megabytes.
        pick = np.random.default_rng(seed).choice(n_distinct, max_contexts, replace=False)
        keep = [keep[i] for i in np.sort(pick)]
    n = len(keep)
    if n < 2:
        raise ElmoUserError(f"{' / '.join(words)}: {n} distinct context(s) in the index; "
                            "need at least 2 to cluster")
    x = fsl_to_numpy(table.column("vector")).astype(np.float32)[keep]
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # cosine geometry
    scores: dict[int, float] = {}
    if k == "auto":
        for kk in range(2, min(max_k, n - 1) + 1):
            labels, _ = _kmeans(x, kk, seed)
            if len(set(labels.tolist())) > 1:
                # Sampled: silhouette costs O(n^2).
                scores[kk] = float(silhouette_score(x, labels, sample_size=min(n, sample),
                                                    random_state=seed))
        chosen = max(scores, key=lambda kk: scores[kk]) if scores else 1
    else:
        chosen = int(k)
        if not 1 <= chosen <= n:
            raise ElmoUserError(f"--k must be between 1 and the {n} distinct contexts")
    labels, centres = _kmeans(x, chosen, seed)
    if chosen not in scores and 1 < len(set(labels.tolist())) < n:
        scores[chosen] = float(silhouette_score(x, labels, sample_size=min(n, sample),
                                                random_state=seed))
    centres /= np.maximum(np.linalg.norm(centres, axis=1, keepdims=True), 1e-12)
    occurrences = [rows[i] for i in keep]
    for hit, sim in zip(occurrences, (x * centres[labels]).sum(1), strict=True):
        hit.similarity = float(sim)  # to its cluster's centre
    # Largest cluster first, labelled 0..k-1.
    order = np.argsort(-np.bincount(labels, minlength=chosen), kind="stable")
    relabel = np.empty(chosen, np.int64)
    relabel[order] = np.arange(chosen)
    labels = relabel[labels]
    features = [context_features(h) for h in occurrences]
    phrases = [f[0] for f in features]
    # Other forms of the words are no news about which sense a cluster is.
    stems = set(stem_words(words))
    content = [{w for w in f[1] if stem_words([w])[0] not in stems} for f in features]
    clusters = []
    for label in range(chosen):
        members = np.flatnonzero(labels == label)
        near = members[np.argsort([-occurrences[i].similarity for i in members], kind="stable")]
        least = max(2, round(MIN_WORD_SHARE * len(members)))
        clusters.append(SenseCluster(
            label, len(members), [occurrences[i] for i in near[:examples]],
            typical(phrases, labels, label, least=2, n=2),
            typical(content, labels, label, least=least, n=3)))
    pca = PCA(n_components=min(2, n, x.shape[1]), random_state=seed).fit(x)
    points = pca.transform(x)
    explained = [float(v) for v in pca.explained_variance_ratio_]
    if points.shape[1] < 2:
        points, explained = np.c_[points, np.zeros(n)], [*explained, 0.0]
    return ClusterResult(list(words), chosen, scores, clusters, labels, points, occurrences,
                         (explained[0], explained[1]), ix.meta.mix_name, k == "auto",
                         n_rows, n_distinct)


def _zeros(n: int) -> Any:
    import pyarrow as pa

    return pa.array(np.zeros(n), pa.float64())
