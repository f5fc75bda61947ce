"""Contextual word senses: nearest occurrences of a word in context, and sense clusters.

    hits = search_senses("data/ds-top.lance", "He plays the guitar in a band", "plays", k=10)
    result = cluster_senses("data/ds-top.lance", ["play"], k="auto")

Search embeds the query sentence with the dataset's own model (found from the dataset
descriptor, or given with ``model_dir`` and checked against its fingerprint), rounds the
layers to the dataset's storage dtype as stored vectors were, mixes them with the index's
mix, and asks the index for the nearest tokens by cosine. Clustering runs k-means
(k-means++ start, cosine geometry: unit vectors) on the mixed vectors of every occurrence;
``k="auto"`` picks the k in 2..8 with the best silhouette.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index import RESULT_COLUMNS, SenseIndex

if TYPE_CHECKING:
    import pyarrow as pa

    from schemas import DatasetDescriptor


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


def locate_word(sentence: str, word: str, occurrence: int = 1) -> QueryToken:
    """Tokenize ``sentence`` like the pipeline and find ``word`` (exact, else any case)."""
    from pipeline.tokenize import split_sentences

    tokens = [t.text for s in split_sentences(sentence) for t in s.tokens]
    if not tokens:
        raise ElmoUserError("the query sentence has no tokens")
    for same in (lambda t: t == word, lambda t: t.lower() == word.lower()):
        found = [i for i, t in enumerate(tokens) if same(t)]
        if found:
            if not 1 <= occurrence <= len(found):
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
                embedder: Any = None) -> np.ndarray:
    """The query token's mixed vector, computed as the stored vectors were."""
    import elmo_model
    from pipeline.lookup.mixes import mix_arrays, read_dataset_descriptor

    descriptor = read_dataset_descriptor(index.meta.dataset)
    if embedder is None:
        options, weights = model_files_for(descriptor, model_dir)
        embedder = elmo_model.load(options, weights, mode="stateless", device="auto")
    layers = embedder.embed([query.tokens])[0][:, query.position, :]  # [L+1, 2P]
    storage = np.float16 if descriptor.dtype == "float16" else np.float32
    # Round like the stored rows, so that a sentence from the corpus finds itself at 0.
    rows = [layers[k][None, :].astype(storage) for k in range(layers.shape[0])]
    return mix_arrays(rows, index.mix)[0]


def search_senses(index: str | SenseIndex, sentence: str, word: str, k: int = 10,
                  same_word: bool = False, occurrence: int = 1, model_dir: str | None = None,
                  embedder: Any = None, exact: bool = False) -> list[Hit]:
    """Occurrences nearest in meaning to ``word`` as used in ``sentence``."""
    ix = index if isinstance(index, SenseIndex) else SenseIndex(index)
    query = locate_word(sentence, word, occurrence)
    vector = embed_query(ix, query, model_dir, embedder)
    words = [query.word] if same_word else None
    return hits_from_table(ix.search(vector, k=k, words=words, exact=exact))


# --------------------------------------------------------------------------- clustering


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def kmeans(x: np.ndarray, k: int, seed: int = 0, iterations: int = 100,
           restarts: int = 4) -> tuple[np.ndarray, np.ndarray, float]:
    """(labels, centres, inertia): Lloyd's algorithm from k-means++ starts, best of restarts."""
    rng = np.random.default_rng(seed)
    best: tuple[np.ndarray, np.ndarray, float] | None = None
    sq = (x * x).sum(1)
    for _ in range(restarts):
        centres = [x[rng.integers(len(x))]]
        for _ in range(1, k):
            d = np.min(sq[:, None] - 2 * x @ np.array(centres).T
                       + (np.array(centres) ** 2).sum(1)[None, :], axis=1).clip(0)
            p = d / d.sum() if d.sum() > 0 else np.full(len(x), 1 / len(x))
            centres.append(x[rng.choice(len(x), p=p)])
        c = np.array(centres)
        labels = np.zeros(len(x), np.int64)
        for it in range(iterations):
            dist = sq[:, None] - 2 * x @ c.T + (c * c).sum(1)[None, :]
            new = dist.argmin(1)
            if it and np.array_equal(new, labels):
                break
            labels = new
            for j in range(k):
                members = x[labels == j]
                c[j] = members.mean(0) if len(members) else x[rng.integers(len(x))]
        inertia = float(np.min(sq[:, None] - 2 * x @ c.T + (c * c).sum(1)[None, :], 1).sum())
        if best is None or inertia < best[2]:
            best = (labels.copy(), c.copy(), inertia)
    assert best is not None
    return best


def silhouette(x: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette (Euclidean on the given rows); 0 when undefined."""
    ks = np.unique(labels)
    if len(ks) < 2:
        return 0.0
    d = np.sqrt(np.maximum((x * x).sum(1)[:, None] - 2 * x @ x.T + (x * x).sum(1)[None, :], 0))
    scores = np.zeros(len(x))
    for i in range(len(x)):
        own = labels == labels[i]
        if own.sum() <= 1:
            continue
        a = d[i, own].sum() / (own.sum() - 1)
        b = min(d[i, labels == j].mean() for j in ks if j != labels[i])
        scores[i] = (b - a) / max(a, b, 1e-12)
    return float(scores.mean())


@dataclass
class SenseCluster:
    label: int
    size: int
    examples: list[Hit] = field(default_factory=list)  # nearest the centre first


@dataclass
class ClusterResult:
    words: list[str]
    k: int
    silhouettes: dict[int, float]
    clusters: list[SenseCluster]
    labels: np.ndarray
    points: np.ndarray  # 2-D PCA projection of the unit vectors, for plotting


def cluster_senses(index: str | SenseIndex, words: Sequence[str], k: int | str = "auto",
                   examples: int = 3, max_k: int = 8, seed: int = 0,
                   sample: int = 1500) -> ClusterResult:
    ix = index if isinstance(index, SenseIndex) else SenseIndex(index)
    table = ix.occurrences(words, columns=RESULT_COLUMNS)
    n = table.num_rows
    if n < 2:
        raise ElmoUserError(f"{' / '.join(words)}: {n} occurrence(s) in the index; "
                            "need at least 2 to cluster")
    from pipeline.lookup.mixes import fsl_to_numpy

    x = _unit(fsl_to_numpy(table.column("vector")).astype(np.float32))
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(n, size=min(n, sample), replace=False))  # silhouette is O(n^2)
    scores: dict[int, float] = {}
    if k == "auto":
        for kk in range(2, min(max_k, n - 1) + 1):
            labels, _, _ = kmeans(x, kk, seed)
            scores[kk] = silhouette(x[pick], labels[pick])
        chosen = max(scores, key=lambda kk: scores[kk]) if scores else 1
    else:
        chosen = int(k)
        if not 1 <= chosen <= n:
            raise ElmoUserError(f"--k must be between 1 and the {n} occurrences")
    labels, centres, _ = kmeans(x, chosen, seed)
    hits = hits_from_table(table.drop_columns(["vector"]).append_column(
        "_distance", _cosine_to_centres(x, centres, labels)))
    order = np.argsort(-np.bincount(labels, minlength=chosen), kind="stable")
    clusters = []
    for new_label, j in enumerate(order):
        members = np.flatnonzero(labels == j)
        near = members[np.argsort([-hits[i].similarity for i in members], kind="stable")]
        clusters.append(SenseCluster(new_label, len(members),
                                     [hits[i] for i in near[:examples]]))
    relabel = np.empty(chosen, np.int64)
    relabel[order] = np.arange(chosen)
    centred = x - x.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    points = centred @ vt[:2].T if vt.shape[0] >= 2 else np.c_[centred @ vt[:1].T, np.zeros(n)]
    return ClusterResult(list(words), chosen, scores, clusters, relabel[labels], points)


def _cosine_to_centres(x: np.ndarray, centres: np.ndarray, labels: np.ndarray) -> Any:
    import pyarrow as pa

    c = _unit(centres)[labels]
    return pa.array(1.0 - (x * c).sum(1), pa.float64())


# --------------------------------------------------------------------------- plotting

PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]


def write_scatter_png(path: str | Path, points: np.ndarray, labels: np.ndarray,
                      size: int = 480, radius: int = 3) -> Path:
    """A plain PNG scatter plot (no plotting library: matplotlib is not a dependency)."""
    image = np.full((size, size, 3), 255, np.uint8)
    margin = 20
    lo, hi = points.min(0), points.max(0)
    span = np.where(hi - lo > 0, hi - lo, 1.0)
    xy = margin + (points - lo) / span * (size - 2 * margin)
    image[margin - 1, margin:size - margin] = image[size - margin, margin:size - margin] = 200
    image[margin:size - margin, margin - 1] = image[margin:size - margin, size - margin] = 200
    yy, xx = np.mgrid[-radius:radius + 1, -radius:radius + 1]
    disc = (xx * xx + yy * yy) <= radius * radius
    for (px, py), label in zip(xy, labels, strict=True):
        cx, cy = round(float(px)), round(float(size - 1 - py))
        ys, xs = cy + yy[disc], cx + xx[disc]
        ok = (ys >= 0) & (ys < size) & (xs >= 0) & (xs < size)
        image[ys[ok], xs[ok]] = PALETTE[int(label) % len(PALETTE)]
    raw = b"".join(b"\x00" + image[r].tobytes() for r in range(size))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    png = (b"\x89PNG\r\n\x1a\n"
           + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
    path = Path(path)
    path.write_bytes(png)
    return path
