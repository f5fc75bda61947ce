"""Search by passage: the stored sentences or documents whose pooled vectors are nearest
(cosine) to a text's.

    found = PassageSearch("runs/example").search("Will you play upon this pipe ?", k=5)

The query text is tokenized with the dataset's tokenizer, embedded with the dataset's own
model, its layers rounded as the stored ones were (``query_vector`` of sense search),
mixed with the table's mix and pooled with its method over all the text's tokens: a
sentence of the corpus finds itself first. The search is exact (every live row of the
pooled table, one matrix product): pooled tables hold one row per sentence or document,
tens of times fewer rows than tokens, so a brute-force scan stays in milliseconds up to
about a million rows (BENCHMARKS.md, "issue 49"). ``where`` keeps documents whose fields
pass (``doc_fields``); every hit carries its text and its document's fields.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.doc_fields import DocumentTable, as_filters, parse_where
from pipeline.lookup.layers.mixes import mix_arrays
from pipeline.lookup.pooled.pooling import (
    DEFAULT_METHOD,
    DEFAULT_MIX,
    check_by,
    check_method,
    pool_vectors,
)
from pipeline.lookup.pooled.store import PooledVectors, load_pooled, named_mix
from schemas.dataset import Dataset, open_dataset
from schemas.layers import as_stored

if TYPE_CHECKING:
    from pipeline.lookup.doc_fields import Filters

# A document's text in a hit is cut here (a document may be a whole book).
MAX_DOCUMENT_CHARS = 1_000
MAX_K = 1_000
TEXT_SHARDS = 64  # shards whose sentence texts a search keeps


@dataclass
class Passage:
    """One hit: a sentence (``sent_idx`` set) or a document, its text and fields."""

    rank: int
    similarity: float
    doc_id: str
    sent_idx: int | None
    text: str
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {"rank": self.rank, "similarity": round(self.similarity, 6),
               "doc_id": self.doc_id}
        if self.sent_idx is not None:
            out["sent_idx"] = self.sent_idx
        return {**out, "text": self.text, "document": self.fields}

    def line(self) -> str:
        where = self.doc_id if self.sent_idx is None else f"{self.doc_id}#{self.sent_idx}"
        source = self.fields.get("source", "")
        text = " ".join(self.text.split())
        return (f"{self.rank:>3}. {self.similarity:.4f}  {where}  {text[:160]}"
                + (f"  [{source}]" if source else ""))


def query_tokens(text: str, tokenizer: Any) -> list[list[str]]:
    """The query's sentences as token lists (the dataset's tokenizer)."""
    sentences = [[t.text for t in s.tokens] for s in tokenizer.split_sentences(text)]
    sentences = [s for s in sentences if s]
    if not sentences:
        raise ElmoUserError("the query text has no tokens")
    return sentences


def passage_vector(layers: Sequence[np.ndarray], ds: Dataset, mix: str, method: str
                   ) -> np.ndarray:
    """The pooled vector of a text from its sentences' layers (each ``[L+1, n, 2P]``, as
    the embedder returns them), made as the stored rows were: rounded to the storage
    dtype, mixed, pooled over every token."""
    the_mix = named_mix(ds, mix)
    dtype = ds.descriptor.dtype
    mixed = [mix_arrays([as_stored(np.asarray(s[k], np.float32), dtype)
                         for k in range(s.shape[0])], the_mix) for s in layers]
    return pool_vectors(np.concatenate(mixed), method)


class PassageSearch:
    """A dataset's pooled tables, held for searching (each table read once, when first
    searched). ``embed``: token lists -> layers (default: the dataset's model, loaded on
    first use; ``model_dir`` overrides where it is found)."""

    def __init__(self, dataset: str | Dataset, *, model_dir: str | None = None,
                 embed: Callable[[list[list[str]]], list[np.ndarray]] | None = None,
                 storage_options: dict | None = None) -> None:
        self.ds = dataset if isinstance(dataset, Dataset) \
            else open_dataset(dataset, storage_options)
        self.model_dir, self._embed = model_dir, embed
        self.documents = DocumentTable(self.ds)
        self.tables: dict[tuple[str, str, str], PooledVectors] = {}
        self._tokenizer: Any = None
        self._texts: dict[str, dict[tuple[str, int], str]] = {}
        self._sentence_files: dict[str, str] | None = None
        self._lock = threading.Lock()  # a server searches on several threads

    def pooled(self, by: str, mix: str, method: str) -> PooledVectors:
        key = (check_by(by), named_mix(self.ds, mix).name, check_method(method))
        with self._lock:
            if key not in self.tables:
                self.tables[key] = load_pooled(self.ds, by, mix, method)
            return self.tables[key]

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from pipeline.lookup.senses.search import dataset_tokenizer

            self._tokenizer = dataset_tokenizer(self.ds.descriptor)
        return self._tokenizer

    def embed(self, sentences: list[list[str]]) -> list[np.ndarray]:
        if self._embed is None:
            import elmo_model
            from pipeline.lookup.senses.search import model_files_for

            options, weights = model_files_for(self.ds.descriptor, self.model_dir)
            embedder = elmo_model.load(options, weights, mode="stateless", device="auto")
            self._embed = embedder.embed
        return self._embed(sentences)

    def search(self, text: str, k: int = 10, by: str = "sentence", mix: str = DEFAULT_MIX,
               method: str = DEFAULT_METHOD, where: Sequence[str] = (),
               filters: Filters = None) -> list[Passage]:
        """The ``k`` sentences (or documents) nearest to ``text``. ``where``: conditions
        as ``--where`` writes them; ``filters``: the same as a mapping."""
        check_k(k)
        pooled = self.pooled(by, mix, method)
        keep = self.allowed(where, filters)
        vector = passage_vector(self.embed(query_tokens(text, self.tokenizer)), self.ds,
                                mix, method)
        return self.nearest(pooled, vector, k, keep)

    def allowed(self, where: Sequence[str] = (), filters: Filters = None) -> set[str] | None:
        """The doc_ids whose documents pass the conditions (None: no conditions)."""
        conditions = as_filters(filters) + [c for text in where for c in parse_where(text)]
        if not conditions:
            return None
        typed = [c.typed(self.documents.check(c.field)) for c in conditions]
        return set(self.documents.doc_ids_where(typed))

    def nearest(self, pooled: PooledVectors, vector: np.ndarray, k: int,
                keep: set[str] | None = None) -> list[Passage]:
        """The ``k`` rows of ``pooled`` nearest to ``vector`` (of those in ``keep``)."""
        if vector.shape[0] != pooled.unit.shape[1]:
            raise ElmoUserError(f"the query vector has {vector.shape[0]} values, the table "
                                f"{pooled.unit.shape[1]}")
        unit = vector / max(float(np.linalg.norm(vector)), 1e-12)
        similarity = pooled.unit @ unit.astype(np.float32)
        if keep is not None:
            similarity[~np.isin(pooled.doc_ids, list(keep))] = -np.inf
        k = min(k, int(np.isfinite(similarity).sum()))
        if k <= 0:
            return []
        top = np.argpartition(-similarity, k - 1)[:k]
        top = top[np.lexsort((top, -similarity[top]))]
        return [self._passage(pooled, int(row), rank, float(similarity[row]))
                for rank, row in enumerate(top, 1)]

    def _passage(self, pooled: PooledVectors, row: int, rank: int, similarity: float
                 ) -> Passage:
        shard_key = str(pooled.shards[row])
        part, shard_text = shard_key.split("/")[:2]
        shard = int(shard_text.split("=", 1)[1])
        doc_id = str(pooled.doc_ids[row])
        sent_idx = None if pooled.sent_idx is None else int(pooled.sent_idx[row])
        fields = dict(self.documents.of(part, shard, doc_id))
        return Passage(rank, similarity, doc_id, sent_idx,
                       self._text(shard_key, doc_id, sent_idx), fields)

    def _text(self, shard_key: str, doc_id: str, sent_idx: int | None) -> str:
        texts = self._shard_texts(shard_key)
        if sent_idx is not None:
            return texts.get((doc_id, sent_idx), "")
        # A document's sentences, in order (a shard holds a few thousand at most).
        text = " ".join(t for (d, _), t in sorted(texts.items()) if d == doc_id)
        return text if len(text) <= MAX_DOCUMENT_CHARS \
            else text[:MAX_DOCUMENT_CHARS].rstrip() + " ..."

    def _shard_texts(self, shard_key: str) -> dict[tuple[str, int], str]:
        """One shard's sentence texts by key, read once and kept (the last
        ``TEXT_SHARDS`` shards used): hits cluster in few shards, and a shard file read
        per hit cost about 10 ms each."""
        with self._lock:
            return self._read_shard_texts(shard_key)

    def _read_shard_texts(self, shard_key: str) -> dict[tuple[str, int], str]:
        import pyarrow.parquet as pq

        if shard_key in self._texts:
            self._texts[shard_key] = self._texts.pop(shard_key)  # most recently used last
            return self._texts[shard_key]
        if self._sentence_files is None:
            self._sentence_files = dict(self.ds.shard_files("sentences"))
        path = self._sentence_files.get(shard_key)
        rows = pq.read_table(path, filesystem=self.ds.arrow_filesystem(),
                             columns=["doc_id", "sent_idx", "text"]) if path else None
        texts = {} if rows is None else dict(zip(
            zip(rows.column("doc_id").to_pylist(), rows.column("sent_idx").to_pylist(),
                strict=True), rows.column("text").to_pylist(), strict=True))
        self._texts[shard_key] = texts
        while len(self._texts) > TEXT_SHARDS:
            self._texts.pop(next(iter(self._texts)))
        return texts


def check_k(k: int) -> None:
    if not 1 <= k <= MAX_K:
        raise SettingError("k", lambda name: f"{name('k')} must be 1..{MAX_K}, not {k}")
