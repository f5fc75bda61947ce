"""What the server holds open for its lifetime: the dataset, its model, its indexes, its
documents' fields and its SQL worker (a guarded DuckDB connection in a process of its own,
under a memory cap); and the reads the routes make of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.doc_fields import DocumentTable
from pipeline.lookup.index.sense_index import RESULT_COLUMNS, SenseIndex, token_filter
from pipeline.lookup.layers.mixes import mix_arrays
from pipeline.lookup.senses.hits import Hit, hits_from_table
from pipeline.lookup.senses.search import dataset_tokenizer, model_files_for
from pipeline.lookup.serve.follow import FollowedIndex
from pipeline.lookup.serve.limits import SQL_MEMORY_MB, SQL_TIMEOUT_S
from pipeline.lookup.serve.sql_worker import SqlWorker, WorkerSettings
from schemas.dataset import Dataset, open_dataset

if TYPE_CHECKING:
    import numpy as np

    from pipeline.tokenize import Tokenizer

DOCUMENT_COLUMNS = ("source", "line")  # every document has these; metadata adds its keys


def index_name(spec: str) -> tuple[str, str]:
    """``NAME=URI`` or ``URI`` (named by its last path part without ``.lance``)."""
    name, sep, uri = spec.partition("=")
    if not sep or "/" in name or not name:
        uri = spec
        name = Path(spec.rstrip("/")).name.removesuffix(".lance") or "index"
    return name, uri


@dataclass
class ServedStore:
    dataset_uri: str
    ds: Dataset
    tokenizer: Tokenizer
    embedder: Any
    # Each follows its builds: a request is answered from the version last published
    # (follow.py), so an index rebuilt under the server needs no restart.
    indexes: dict[str, FollowedIndex]
    sql: SqlWorker
    documents: dict[str, dict[str, Any]] = field(default_factory=dict)
    model_options: str = ""

    @classmethod
    def open(cls, dataset: str, index_specs: list[str], model_dir: str | None = None,
             sql_timeout_s: float = SQL_TIMEOUT_S,
             searchers: dict[str, Any] | None = None,
             check_files: bool = True, sql_memory_mb: int = SQL_MEMORY_MB) -> ServedStore:
        """``searchers``: index name -> the Ray actors that hold that index's shards
        (``ivf_ray.start_searchers``, ``elmo serve --shard-actors``): its searches go
        to them, and this process opens none of its shards. ``check_files``: /sql checks
        the dataset's files before each query (``GuardedSql``); ``sql_memory_mb``: what
        a /sql query may take (``sql_worker.py``)."""
        import elmo_model

        ds = open_dataset(dataset)
        # Started first: it opens the dataset while the model loads here.
        sql = SqlWorker(WorkerSettings(dataset, sql_timeout_s, sql_memory_mb, check_files))
        try:
            indexes: dict[str, FollowedIndex] = {}
            for spec in index_specs:
                name, uri = index_name(spec)
                if name in indexes:
                    raise SettingError("index_specs", lambda flag, name=name: (
                        f"two indexes are named {name!r}; name them: {flag('index_specs')} "
                        "NAME=URI"))
                held = (searchers or {}).get(name)
                # Ray actors hold the shards of the version they were started on: that index
                # keeps answering from it.
                indexes[name] = FollowedIndex(
                    uri, lambda uri, held=held: _open_served(uri, ds, dataset, held),
                    follow=held is None)
            options, weights = model_files_for(ds.descriptor, model_dir)
            embedder = elmo_model.load(options, weights, mode="stateless", device="auto")
            # The documents' fields, read once, go with results (the worker reads its own
            # for the SQL view's typed fields).
            documents = DocumentTable(ds)
            store = cls(dataset, ds, dataset_tokenizer(ds.descriptor), embedder, indexes, sql,
                        model_options=str(options))
            store.documents = dict(documents.rows())  # doc_id -> source, line, metadata
            sql.wait_ready()
        except BaseException:
            sql.close()  # a server that does not start leaves no worker behind
            raise
        return store

    def index(self, name: str | None) -> tuple[str, SenseIndex]:
        if not self.indexes:
            raise LookupError("this server has no sense index; start it with --index URI")
        if name is None:
            name = next(iter(self.indexes))
        if name not in self.indexes:
            raise LookupError(f"no index {name!r} here (indexes: {', '.join(self.indexes)})")
        return name, self.indexes[name].get()

    @property
    def generation(self) -> int:
        """Changes when any index is swapped for a newer build (keys cached answers)."""
        return sum(followed.generation for followed in self.indexes.values())

    def document_fields(self) -> list[str]:
        names = dict.fromkeys(DOCUMENT_COLUMNS)
        for fields in self.documents.values():
            names.update(dict.fromkeys(fields))
        return list(names)

    def tokens(self, sentence: str) -> list[str]:
        tokens = [t.text for s in self.tokenizer.split_sentences(sentence) for t in s.tokens]
        if not tokens:
            raise ElmoUserError("the sentence has no tokens")
        return tokens

    def info(self) -> dict[str, Any]:
        d = self.ds.descriptor
        counts = self.sql.execute(
            "SELECT (SELECT count(*) FROM documents), (SELECT count(*) FROM sentences), "
            "(SELECT count(*) FROM tokens)", {})[0]
        return {
            "dataset": {
                "uri": self.dataset_uri, "dtype": d.dtype, "dim": d.dim,
                "layers": d.n_output_layers, "model": self.model_options,
                "model_fingerprint": d.model_fingerprint, "tokenizer": d.tokenizer,
                "rows": dict(zip(("documents", "sentences", "tokens"), counts, strict=True)),
                "mixes": ["top", "average", *self.ds.mixes()],
                "document_fields": self.document_fields(),
            },
            "indexes": [{"name": name, "uri": ix.uri, "mix": ix.meta.mix_name,
                         "mix_weights": ix.mix.weights, "rows": ix.meta.rows,
                         "words": _vocabulary_size(ix), "vector_index": ix.meta.built,
                         # What answers searches without a word (None: LanceDB).
                         "in_memory_ivf": ix.meta.ivf if ix.ivf() is not None else None,
                         **_shard_actors(ix)}
                        for name, ix in ((n, f.get()) for n, f in self.indexes.items())],
        }

    def mixed(self, layers: list[np.ndarray], mix: str | None) -> list[np.ndarray]:
        """Each sentence's ``[L+1, n, dim]`` layers, or its ``[n, dim]`` mix."""
        if mix is None:
            return layers
        the_mix = self.ds.mix(mix)
        return [mix_arrays(list(x), the_mix) for x in layers]

    def occurrences(self, index: SenseIndex, word: str, limit: int, offset: int
                    ) -> tuple[int, list[Hit]]:
        import pyarrow as pa

        index.require_indexed([word], "token_lower")
        total = index.word_rows([word])
        table = (index.table.search().where(token_filter([word]))
                 .select(index.stored(RESULT_COLUMNS)).offset(offset).limit(limit).to_arrow())
        complete = index.completed(RESULT_COLUMNS)  # the sentence text, by key
        table = table if complete is None else complete(table)
        table = table.append_column("_distance", pa.array([1.0] * table.num_rows))
        hits = hits_from_table(table)
        for rank, hit in enumerate(hits, offset + 1):
            hit.rank, hit.similarity = rank, 0.0
        return total, hits

    def context(self, doc_id: str, sent_idx: int, context: int) -> list[dict[str, Any]]:
        rows = self.sql.execute(
            "SELECT sent_idx, text FROM sentences WHERE doc_id = $doc AND sent_idx BETWEEN "
            "$lo AND $hi ORDER BY sent_idx",
            {"doc": doc_id, "lo": sent_idx - context, "hi": sent_idx + context})
        return [{"sent_idx": s, "text": t} for s, t in rows]


def _open_served(uri: str, ds: Dataset, dataset: str, searchers: Any) -> SenseIndex:
    """The index at ``uri`` opened to serve ``ds``: checked, and warmed (its sentences
    and in-memory IVF loaded now, not by the first requests)."""
    ix = SenseIndex(uri)
    if ix.meta.model_fingerprint != ds.descriptor.model_fingerprint:
        raise ElmoUserError(f"{uri} indexes a dataset of another model than "
                            f"{dataset}; serve it with its own dataset")
    if searchers is not None:
        ix.search_with(searchers)
    ix.hold_sentences()  # results then take their sentence texts from memory
    ix.ivf()  # loaded now, not on the first search without a word
    return ix


def _vocabulary_size(ix: SenseIndex) -> int | None:
    counts = ix.word_counts.table()
    return None if counts is None else counts.num_rows


def _shard_actors(ix: SenseIndex) -> dict[str, Any]:
    """``shard_actors`` (their count and the nodes they run on) for an index whose
    searches go to Ray actors (``--shard-actors``); nothing for one searched here."""
    held = ix.ivf()
    nodes = getattr(held, "nodes", None)
    if nodes is None:
        return {}
    return {"shard_actors": {"actors": len(nodes), "nodes": len(set(nodes))}}
