"""Which mix and pooling make the best sentence and document vectors (issue 49): measured
on labels that come with a corpus, against TF-IDF, so that ``elmo pool``'s defaults follow.

    PYTHONPATH=$PWD .venv/bin/python bench/pooled_features.py --out runs/bench-pooled

Corpus: the four books of /work/shared/corpora (austen, moby_dick, shakespeare, web_bible),
each cut into passages of about ``--words`` words (whole lines), ``--passages`` of them
spread evenly over the book; each passage is one document (JSON Lines, with its ``book``),
embedded with ``pipeline.embed`` (the bundled model, int8 storage, local executor).

Features, per mix (``layer:0`` is the context-free token layer) and pooling method, from
one pass over the stored layers per mix with the product's own pooling (``pool_file``'s
loop: ``iter_mixed`` + ``GroupStats``); baseline: TF-IDF (scikit-learn, words, sublinear
tf) of the same documents and sentences.

Tasks (seeded; each feature set sees the same splits):
- doc probe: logistic regression predicting a document's book from its vector, 5-fold
  stratified cross-validation accuracy;
- sent probe: the same from single sentence vectors, folds grouped by document (no
  document's sentences on both sides);
- same-doc retrieval: for each sentence of a random sample (documents with >= 2
  sentences), is its nearest other sentence (cosine, over all sentences) from the same
  document (P@1), and from the same book.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BOOKS = ("austen", "moby_dick", "shakespeare", "web_bible")
MIXES = ("layer:0", "layer:1", "layer:2", "top", "average")


def passages(text: str, words: int, count: int) -> list[str]:
    """``count`` passages of about ``words`` words (whole lines), spread over ``text``."""
    out, current, n = [], [], 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        current.append(line)
        n += len(line.split())
        if n >= words:
            out.append(" ".join(current))
            current, n = [], 0
    picks = np.linspace(0, len(out) - 1, min(count, len(out))).round().astype(int)
    return [out[i] for i in sorted(set(picks))]


def write_corpus(corpora: Path, out: Path, words: int, count: int) -> Path:
    path = out / "passages.jsonl"
    with path.open("w") as handle:
        for book in BOOKS:
            text = (corpora / f"{book}.txt").read_text(encoding="utf-8")
            for i, passage in enumerate(passages(text, words, count)):
                handle.write(json.dumps({"id": f"{book}-{i:04d}", "text": passage,
                                         "book": book}) + "\n")
    return path


def pooled_features(ds, mix_name: str, methods: tuple[str, ...]) -> dict:
    """{(by, method): (keys, vectors)} from one pass over the stored layers."""
    from pipeline.lookup.layers.mixes import iter_mixed
    from pipeline.lookup.pooled.pooling import GroupStats, run_starts

    mix = ds.mix(mix_name)
    dim = ds.descriptor.dim
    stats = {(by, m): GroupStats(m, dim) for by in ("sentence", "document") for m in methods}
    for meta, vectors in iter_mixed(ds, mix, ["doc_id", "sent_idx"], batch_rows=8192):
        doc = meta.column("doc_id").to_numpy(zero_copy_only=False)
        sent = meta.column("sent_idx").to_numpy()
        s_starts, d_starts = run_starts(doc, sent), run_starts(doc)
        s_keys = list(zip(doc[s_starts], sent[s_starts], strict=True))
        d_keys = list(zip(doc[d_starts], strict=True))
        for (by, _), group in stats.items():
            if by == "sentence":
                group.add(vectors, s_starts, s_keys)
            else:
                group.add(vectors, d_starts, d_keys)
    out = {}
    for key, group in stats.items():
        keys, _, pooled = group.merged()
        out[key] = ({k: i for i, k in enumerate(keys)}, pooled)
    return out


def probe(x, y, groups=None, seed: int = 0) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold, StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    dense = isinstance(x, np.ndarray)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0)) \
        if dense else LogisticRegression(max_iter=2000, C=10.0)
    folds = StratifiedKFold(5, shuffle=True, random_state=seed) if groups is None \
        else GroupKFold(5)
    return float(cross_val_score(model, x, y, cv=folds, groups=groups).mean())


def retrieval(x, docs: np.ndarray, books: np.ndarray, sample: np.ndarray
              ) -> tuple[float, float]:
    """P@1 same document and same book of each sampled row's nearest other row."""
    if isinstance(x, np.ndarray):
        unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        sims = unit[sample] @ unit.T
    else:
        sims = (x[sample] @ x.T).toarray()  # TF-IDF rows are unit length
    sims[np.arange(len(sample)), sample] = -np.inf
    nearest = sims.argmax(axis=1)
    return (float((docs[nearest] == docs[sample]).mean()),
            float((books[nearest] == books[sample]).mean()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/bench-pooled")
    parser.add_argument("--corpora", default=str(REPO.parent.parent / "shared" / "corpora"))
    parser.add_argument("--words", type=int, default=100)
    parser.add_argument("--passages", type=int, default=300, help="per book")
    parser.add_argument("--sample", type=int, default=2000, help="retrieval queries")
    parser.add_argument("--methods", default="mean,unit_mean,max,mean_max")
    args = parser.parse_args()

    import pyarrow.parquet as pq
    from sklearn.feature_extraction.text import TfidfVectorizer

    import pipeline
    from schemas.dataset import open_dataset

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dataset = out / "dataset"
    if not (dataset / "_dataset.json").exists():
        corpus = write_corpus(Path(args.corpora), out, args.words, args.passages)
        started = time.perf_counter()
        pipeline.embed([str(corpus)], str(dataset), executor="local", progress=True)
        print(f"embedded in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    ds = open_dataset(str(dataset))
    sentences = pq.read_table(dataset / "sentences").to_pandas()
    documents = pq.read_table(dataset / "documents").to_pandas()
    book_of = {d: json.loads(m)["book"] for d, m in zip(documents.doc_id, documents.metadata,
                                                       strict=True)}
    sentences = sentences.sort_values(["doc_id", "sent_idx"]).reset_index(drop=True)
    doc_ids = np.array(sorted(book_of))
    doc_books = np.array([book_of[d] for d in doc_ids])
    sent_docs = sentences.doc_id.to_numpy()
    sent_books = np.array([book_of[d] for d in sent_docs])
    rng = np.random.default_rng(0)
    counts = sentences.groupby("doc_id").size()
    eligible = np.flatnonzero(sentences.doc_id.map(counts).to_numpy() >= 2)
    sample = rng.choice(eligible, min(args.sample, len(eligible)), replace=False)
    doc_text = sentences.groupby("doc_id").text.apply(" ".join).reindex(doc_ids)
    print(f"{len(doc_ids)} documents, {len(sentences)} sentences, "
          f"{int(documents.n_tokens.sum())} tokens", file=sys.stderr)

    rows = []

    def score(name: str, x_doc, x_sent) -> None:
        started = time.perf_counter()
        same_doc, same_book = retrieval(x_sent, sent_docs, sent_books, sample)
        row = {"features": name, "doc_probe": probe(x_doc, doc_books),
               "sent_probe": probe(x_sent, sent_books, groups=sent_docs),
               "same_doc_p1": same_doc, "same_book_p1": same_book}
        rows.append(row)
        print(json.dumps(row), f"({time.perf_counter() - started:.0f} s)", file=sys.stderr,
              flush=True)

    tfidf = TfidfVectorizer(sublinear_tf=True, min_df=2)
    tfidf.fit(doc_text.tolist())
    score("tfidf", tfidf.transform(doc_text.tolist()), tfidf.transform(sentences.text))
    methods = tuple(args.methods.split(","))
    for mix in MIXES:
        started = time.perf_counter()
        features = pooled_features(ds, mix, methods)
        print(f"{mix}: pooled in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        for method in methods:
            d_index, d_vec = features[("document", method)]
            s_index, s_vec = features[("sentence", method)]
            x_doc = d_vec[[d_index[(d,)] for d in doc_ids]]
            x_sent = s_vec[[s_index[(d, s)] for d, s in zip(sentences.doc_id,
                                                             sentences.sent_idx,
                                                             strict=True)]]
            score(f"{mix} {method}", x_doc, x_sent)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print("| features | doc probe acc | sentence probe acc | same-doc P@1 | same-book P@1 |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['features']} | {r['doc_probe']:.3f} | {r['sent_probe']:.3f} | "
              f"{r['same_doc_p1']:.3f} | {r['same_book_p1']:.3f} |")


if __name__ == "__main__":
    main()
