"""The read path's Python entries: a dataset to read as tables or query with SQL, and a sense
index to search. ``pipeline.open_dataset`` and ``pipeline.open_index`` return these;
``elmo sql``, ``elmo senses search`` and ``elmo senses cluster`` call the same functions.

    ds = pipeline.open_dataset("runs/example")
    ds.to_table(["doc_id", "token"], mix="top")        # + a float32 ``vector`` column
    ds.sql("SELECT token, count(*) n FROM tokens GROUP BY 1 ORDER BY n DESC LIMIT 5")
    ix = pipeline.open_index("runs/example-top.lance")
    ix.search("Will you play upon this pipe ?", "play", k=5, where={"source": "..."})
    ix.senses("play")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError
from schemas.dataset import Dataset, open_dataset
from schemas.layout import TABLES

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.pooled.search import Passage
    from pipeline.lookup.senses.clusters import ClusterResult
    from pipeline.lookup.senses.hits import Hit
    from schemas.mix_specs import Mix

# A tokens row without its layers: what a mixed table carries beside ``vector``.
TOKEN_COLUMNS = ("doc_id", "sent_idx", "tok_idx", "token", "char_start", "char_end")


class DatasetReader:
    """A stored dataset, read as Arrow tables or queried with SQL (DuckDB)."""

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        self.stored: Dataset = open_dataset(uri, storage_options)

    @property
    def uri(self) -> str:
        return self.stored.uri

    @property
    def descriptor(self) -> Any:
        return self.stored.descriptor

    def mixes(self) -> dict[str, Mix]:
        """The mixes stored with the dataset (``top``, ``average``, ``layer:k`` are built in)."""
        return self.stored.mixes()

    def to_table(self, columns: Sequence[str] | None = None,
                 mix: str | Mapping[str, Any] | Mix | None = None,
                 table: str = "tokens") -> pa.Table:
        """The live rows of ``table`` as one Arrow table (for datasets that fit in memory;
        ``pipeline.lookup.layers.mixes.iter_mixed`` streams).

        Without ``mix``: every column as stored, each layer as floats (``layer_0`` ..
        ``layer_L``, int8 times its scale) and the ``shard`` the row is stored in. With
        ``mix`` (a name such as ``top``, ``layer:1`` or a stored mix, or
        ``{"weights": [...]}``): ``columns`` (default: every token column) and the mixed
        vector as a float32 ``vector`` column."""
        from pipeline.lookup.layers.tokens import read_table

        if table not in TABLES:
            raise ElmoUserError(f"no table {table!r}; the tables are {', '.join(TABLES)}")
        if mix is None:
            rows = read_table(self.stored, table)
            return rows if columns is None else rows.select(_known(columns, rows.column_names,
                                                                   table))
        if table != "tokens":
            raise ElmoUserError(f"a mix applies to the tokens table, not {table!r}")
        return self._mixed(list(columns or TOKEN_COLUMNS), self.stored.mix(mix))

    def _mixed(self, columns: list[str], mix: Mix) -> pa.Table:
        import numpy as np
        import pyarrow as pa

        from pipeline.lookup.layers.mixes import iter_mixed

        _known(columns, TOKEN_COLUMNS, "tokens (besides its layers)")
        metas, vectors = [], []
        for meta, mixed in iter_mixed(self.stored, mix, columns):
            metas.append(meta)
            vectors.append(mixed)
        dim = self.descriptor.dim
        values = np.concatenate(vectors) if vectors else np.zeros((0, dim), np.float32)
        vector = pa.FixedSizeListArray.from_arrays(
            pa.array(np.ascontiguousarray(values, np.float32).reshape(-1)), dim)
        if metas:
            table = pa.Table.from_batches(metas) if isinstance(metas[0], pa.RecordBatch) \
                else pa.concat_tables(metas)
        else:
            table = pa.table({c: pa.array([], pa.string()) for c in columns})
        return table.select(columns).append_column("vector", vector)

    def pooled(self, by: str = "sentence", mix: str | None = None,
               method: str | None = None) -> pa.Table:
        """The pooled vectors ``elmo pool`` stored (one row per sentence or document, a
        float32 ``vector`` list), live rows of one mix and method (defaults: the pooling
        defaults, ``pipeline.lookup.pooled.pooling``)."""
        from pipeline.lookup.pooled.pooling import DEFAULT_METHOD, DEFAULT_MIX
        from pipeline.lookup.pooled.store import read_pooled_table

        return read_pooled_table(self.stored, by, mix or DEFAULT_MIX,
                                 method or DEFAULT_METHOD)

    def sql(self, query: str, params: Mapping[str, Any] | Sequence[Any] | None = None,
            mixes: Sequence[str] = ()) -> pa.Table:
        """One DuckDB query's result over the dataset's views (``tokens``, ``sentences``,
        ``documents``, ``errors``, ``types``; ``elmo_mix`` and ``elmo_cosine``), as an
        Arrow table; what ``elmo sql`` runs. ``params`` fill ``?`` or ``$name``
        placeholders; each of ``mixes`` is first computed into a table ``mix_<name>``."""
        from pipeline.lookup.sql import run_query

        return run_query(self.uri, query, params, mixes=mixes)


class IndexReader:
    """A sense index (``elmo index build``): occurrences of a word searched by meaning and
    clustered into senses."""

    def __init__(self, uri: str) -> None:
        from pipeline.lookup.index.sense_index import SenseIndex

        self.index: SenseIndex = SenseIndex(uri)

    def search(self, sentence: str, word: str, k: int = 10,
               where: Mapping[str, Any] | None = None) -> list[Hit]:
        """The ``k`` occurrences nearest in meaning to ``word`` as used in ``sentence``
        (any of its forms), each with its sentence, document fields and distance.
        ``where``: document fields to keep, e.g. ``{"year": [1861, 1865]}``."""
        from pipeline.lookup.senses.search import search_senses

        return search_senses(self.index, sentence, word, k=k, filters=where)

    def senses(self, word: str, k: int | str = "auto",
               where: Mapping[str, Any] | None = None) -> ClusterResult:
        """``word``'s occurrences clustered into ``k`` senses (``"auto"``: the number the
        silhouette prefers), each named by its typical context words, with examples."""
        from pipeline.lookup.senses.clusters import cluster_senses

        return cluster_senses(self.index, [word], k=k, filters=where)


    def search_passages(self, text: str, k: int = 10, by: str = "sentence",
                        mix: str | None = None, method: str | None = None,
                        where: Mapping[str, Any] | None = None) -> list[Passage]:
        """The ``k`` sentences (or documents) of the index's dataset whose pooled vectors
        (``elmo pool``) are nearest to ``text``'s, with their text and document fields;
        ``mix`` and ``method``: the pooled table's (default: the pooling defaults)."""
        from pipeline.lookup.pooled.pooling import DEFAULT_METHOD, DEFAULT_MIX
        from pipeline.lookup.pooled.search import PassageSearch

        if getattr(self, "_passages", None) is None:
            self._passages = PassageSearch(self.index.meta.dataset,
                                           storage_options=self.index.storage_options)
        return self._passages.search(text, k=k, by=by, mix=mix or DEFAULT_MIX,
                                     method=method or DEFAULT_METHOD, filters=where)


def _known(columns: Sequence[str], names: Sequence[str], table: str) -> list[str]:
    missing = [c for c in columns if c not in names]
    if missing:
        raise ElmoUserError(f"no column {', '.join(map(repr, missing))} in {table}; its "
                            f"columns are {', '.join(names)}")
    return list(columns)
