"""Sense labels as data: each use of a word with its sense, written into the dataset as
the derived table ``senses`` (``derived_tables``), so that a query can join it.

    label_words("data/sotu-top.lance", ["union", "state"])     # elmo senses label union state

Each word is clustered as ``elmo senses cluster`` clusters it (``cluster_senses``: k by
silhouette unless given, written forms centred by case); every use gets a row: the word,
the token's key (``doc_id``, ``sent_idx``, ``tok_idx``) and text, its sense (1 = the
largest), the sense's label (its most typical context words), its cosine distance to the
sense's centre, and the model (fingerprint) and mix (name) its vector came from. Labelling
a word again replaces all its rows at once. Every word is clustered before anything is
written: a word that cannot be labelled writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.sense_index import SenseIndex
from pipeline.lookup.senses.clusters import ClusterResult, cluster_senses
from schemas.derived_tables import replace_rows, senses_schema

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class Labelled:
    word: str
    rows: int
    k: int
    senses: list[str]  # each sense's name, sense 1 first
    path: str  # the file written, relative to the dataset


def label_rows(result: ClusterResult, word: str, model: str) -> pa.Table:
    """The ``senses`` rows of one clustering (every use, repeated contexts too)."""
    import pyarrow as pa

    hits = result.all_occurrences or result.occurrences
    labels = (result.all_labels if len(result.all_labels) else result.labels).tolist()
    similarity = result.all_similarity.tolist() if len(result.all_similarity) \
        else [h.similarity for h in hits]
    texts = [c.typical_text() for c in result.clusters]
    n = len(hits)
    return pa.table({
        "word": pa.array([word] * n, pa.string()),
        "doc_id": pa.array([h.doc_id for h in hits], pa.string()),
        "sent_idx": pa.array([h.sent_idx for h in hits], pa.int32()),
        "tok_idx": pa.array([h.tok_idx for h in hits], pa.int32()),
        "token": pa.array([h.token for h in hits], pa.string()),
        "sense": pa.array([label + 1 for label in labels], pa.int32()),
        "label": pa.array([texts[label] for label in labels], pa.string()),
        "distance": pa.array([max(0.0, 1.0 - s) for s in similarity], pa.float32()),
        "model": pa.array([model] * n, pa.string()),
        "mix": pa.array([result.mix] * n, pa.string())}, schema=senses_schema())


def label_words(index: str | SenseIndex, words: Sequence[str], k: int | str = "auto", *,
                centre: str = "case", seed: int = 0) -> list[Labelled]:
    """Cluster each of ``words`` and write its uses' senses into the index's dataset
    (replacing the word's rows if it was labelled before)."""
    from schemas.dataset import open_dataset

    names = [w.strip().lower() for w in words if w.strip()]
    if not names:
        raise ElmoUserError("name at least one word to label")
    ix = index if isinstance(index, SenseIndex) else SenseIndex(index)
    try:
        ds = open_dataset(ix.meta.dataset, ix.storage_options)
    except (ElmoUserError, OSError) as error:
        raise ElmoUserError(f"labels are written into the index's dataset "
                            f"{ix.meta.dataset}, which is not readable ({error})") from error
    model = ds.descriptor.model_fingerprint
    if model != ix.meta.model_fingerprint:
        raise ElmoUserError(f"{ix.meta.dataset} now holds another model's vectors than the "
                            f"index {ix.uri}; rebuild the index first "
                            f"({ix.build_command('--rebuild')})")
    # Every word first: one that cannot be clustered stops the run before any write.
    clustered = [(word, cluster_senses(ix, [word], k=k, examples=0, centre=centre,
                                       seed=seed)) for word in dict.fromkeys(names)]
    done = []
    for word, result in clustered:
        entry = replace_rows(ds.fs, ds.root, "senses", word, label_rows(result, word, model))
        done.append(Labelled(word, entry["rows"], result.k,
                             [c.name() for c in result.clusters], entry["path"]))
    return done


def labels_summary(done: Sequence[Labelled]) -> list[str]:
    """One line per word, then its senses."""
    lines: list[str] = []
    for item in done:
        lines.append(f"{item.word}: {item.rows} uses labelled with {item.k} senses "
                     f"({item.path})")
        lines.extend(f"    {name}" for name in item.senses)
    return lines

