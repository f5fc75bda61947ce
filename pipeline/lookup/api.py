"""The read path's Python entries: a dataset to read as tables or query with SQL, and a sense
index to search. ``pipeline.open_dataset``, ``pipeline.open_index`` and
``pipeline.build_index`` return these; ``elmo sql``, ``elmo index build`` and ``elmo senses``
call the same functions.

    ds = pipeline.open_dataset("runs/example")
    ds.schema                                              # the tokens table's columns
    ds.count_rows("token=play")                            # the one filter language
    ds.to_table(["doc_id", "token"], mix="top")            # + a float32 ``vector`` column
    ds.sql("SELECT token, count(*) n FROM tokens GROUP BY 1 ORDER BY n DESC LIMIT 5")
    ix = pipeline.build_index(ds, "runs/example-top.lance", mix="top")
    ix.search("Will you play upon this pipe ?", "play", k=5, where="year=1861..1865")
    ix.senses("play")

Filters (``filter=`` on a dataset, ``where=`` on an index) are written as ``elmo ...
--where`` writes them (``"year=1900..1950"``, ``"party=A|B"``, a list of such), as a
mapping (``doc_fields.as_filters``) or, on a dataset, as a pyarrow compute expression.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.doc_fields import Filters, as_filters
from schemas.dataset import Dataset, open_dataset
from schemas.layout import TABLES

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.pooled.search import Passage
    from pipeline.lookup.senses.change import ChangeRanking
    from pipeline.lookup.senses.clusters import ClusterResult
    from pipeline.lookup.senses.hits import Hit
    from schemas.mix_specs import Mix

# A tokens row without its layers: what a mixed table carries beside ``vector``.
TOKEN_COLUMNS = ("doc_id", "sent_idx", "tok_idx", "token", "char_start", "char_end")


class DatasetReader:
    """A stored dataset, read as Arrow tables or batches, or queried with SQL (DuckDB)."""

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        self.stored: Dataset = open_dataset(uri, storage_options)
        self.storage_options = storage_options
        self._con: duckdb.DuckDBPyConnection | None = None
        self._materialized: set[str] = set()
        self._damaged: dict[str, str] = {}  # derived view -> its problem, as connected

    @property
    def uri(self) -> str:
        return self.stored.uri

    @property
    def descriptor(self) -> Any:
        return self.stored.descriptor

    @property
    def schema(self) -> pa.Schema:
        """The tokens table's columns as ``to_table()`` gives them: each layer as floats,
        and the ``shard`` each row is stored in (``schema_of`` for the other tables)."""
        return self.schema_of("tokens")

    def schema_of(self, table: str) -> pa.Schema:
        from pipeline.lookup.layers.tokens import table_schema

        return table_schema(self.descriptor, _table(table))

    def mixes(self) -> dict[str, Mix]:
        """The mixes stored with the dataset (``top``, ``average``, ``layer:k`` are built in)."""
        return self.stored.mixes()

    def count_rows(self, filter: Filters | pc.Expression = None,
                   table: str = "tokens") -> int:
        """The live rows of ``table`` (that pass ``filter``); counted from the files'
        footers when there is no filter, else from the columns other than layers."""
        import pyarrow.parquet as pq

        if filter is None:
            fs = self.stored.arrow_filesystem()
            return sum(pq.read_metadata(path, filesystem=fs).num_rows
                       for path in self.stored.paths(_table(table)))
        meta = [f.name for f in self.schema_of(table) if not f.name.startswith("layer_")]
        return sum(b.num_rows for b in self.to_batches(meta, filter=filter, table=table))

    def to_table(self, columns: Sequence[str] | None = None,
                 filter: Filters | pc.Expression = None,
                 mix: str | Mapping[str, Any] | Mix | None = None,
                 table: str = "tokens") -> pa.Table:
        """The live rows of ``table`` as one Arrow table (for what fits in memory;
        ``to_batches`` streams).

        Without ``mix``: ``columns`` (default: every column as stored, each layer as
        floats: ``layer_0`` .. ``layer_L``, int8 times its scale, and the ``shard`` the
        row is stored in). With ``mix`` (a name such as ``top``, ``layer:1`` or a stored
        mix, or ``{"weights": [...]}``): ``columns`` (default: every token column) and
        the mixed vector as a float32 ``vector`` column. ``filter`` keeps the rows that
        pass, on any column but the layers."""
        import pyarrow as pa

        schema = self._schema(columns, mix, table)
        return pa.Table.from_batches(list(self.to_batches(columns, filter, mix, table)),
                                     schema=schema)

    def to_batches(self, columns: Sequence[str] | None = None,
                   filter: Filters | pc.Expression = None,
                   mix: str | Mapping[str, Any] | Mix | None = None,
                   table: str = "tokens") -> Iterator[pa.RecordBatch]:
        """``to_table``'s rows as record batches, a file's row group (mixed) or a file
        (unmixed) at a time, in file and row order; the arguments are checked here, before
        the first batch is asked for."""
        schema = self._schema(columns, mix, table)
        return self._batches(schema, self._expression(filter, table), mix, table)

    def _batches(self, schema: pa.Schema, expression: Any, mix: Any, table: str
                 ) -> Iterator[pa.RecordBatch]:
        from pipeline.lookup.layers.mixes import iter_mixed
        from pipeline.lookup.layers.tokens import iter_table

        wanted = schema.names if mix is None else schema.names[:-1]
        if mix is None:
            # A filter may name columns that are not wanted: read them too, drop them after.
            read = wanted if expression is None else list(dict.fromkeys([*wanted, *(
                n for n in self.schema_of(table).names if not n.startswith("layer_"))]))
            for piece in iter_table(self.stored, table, columns=read):
                rows = piece if expression is None else _filtered(piece, expression)
                yield from rows.select(wanted).cast(schema).to_batches()
            return
        import pyarrow as pa

        dim = self.descriptor.dim
        read = list(TOKEN_COLUMNS) if expression is not None else wanted
        for meta, mixed in iter_mixed(self.stored, self.stored.mix(mix), read):
            rows = pa.Table.from_batches([meta]) if isinstance(meta, pa.RecordBatch) else meta
            keep = None
            if expression is not None:
                rows = rows.append_column("__row", pa.array(range(rows.num_rows), pa.int64()))
                rows = _filtered(rows, expression)
                keep = rows.column("__row").to_numpy()
            vectors = mixed if keep is None else mixed[keep]
            vector = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)
            out = rows.select(wanted).append_column("vector", vector)
            yield from out.cast(schema).to_batches()

    def _schema(self, columns: Sequence[str] | None, mix: Any, table: str) -> pa.Schema:
        import pyarrow as pa

        full = self.schema_of(table)
        if mix is None:
            return full if columns is None else pa.schema(
                [full.field(c) for c in _known(columns, full.names, table)])
        if table != "tokens":
            raise ElmoUserError(f"a mix applies to the tokens table, not {table!r}")
        self.stored.mix(mix)  # an unknown mix is refused before anything is read
        names = _known(list(columns or TOKEN_COLUMNS), TOKEN_COLUMNS,
                       "tokens (besides its layers)")
        return pa.schema([full.field(c) for c in names] + [
            pa.field("vector", pa.list_(pa.float32(), self.descriptor.dim))])

    def _expression(self, filter: Any, table: str) -> Any:
        """``filter`` as a pyarrow expression, condition text typed by its column."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if filter is None or isinstance(filter, pc.Expression):
            return filter
        schema, expression = self.schema_of(table), None
        for condition in as_filters(filter):
            if condition.field not in schema.names or condition.field.startswith("layer_"):
                raise SettingError("filter", lambda name, c=condition: (
                    f"{name('filter')} {c.describe()!r}: no column {c.field!r} to filter "
                    f"{table} on; its columns are "
                    f"{', '.join(n for n in schema.names if not n.startswith('layer_'))}"))
            kind = schema.field(condition.field).type
            typed = condition.typed("int" if pa.types.is_integer(kind) else "float"
                                    if pa.types.is_floating(kind) else "string")
            expression = typed.expression() if expression is None \
                else expression & typed.expression()
        return expression

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
            mixes: Sequence[str] = ()) -> duckdb.DuckDBPyRelation:
        """A DuckDB relation for ``query`` over the dataset's views (``tokens``,
        ``sentences``, ``documents``, ``errors``, ``senses``; functions ``elmo_mix``,
        ``elmo_cosine``, ``elmo_vector``), to chain (``.filter``, ``.aggregate``) or fetch
        (``.fetchall()``, ``.arrow()``, ``.df()``); what ``elmo sql`` runs. ``params``
        fill ``?`` or ``$name`` placeholders; each of ``mixes`` is first computed into a
        table ``mix_<name>``. Every call uses this object's one connection, whose views
        are built on the first call (``connection``); a DuckDB connection serves one
        thread at a time, so threads each open their own dataset (or ``.cursor()``)."""
        import duckdb

        from pipeline.lookup.sql import materialize_mix, query_error

        self._check_files()
        con = self.connection
        try:
            for spec in mixes:
                if spec not in self._materialized:
                    materialize_mix(con, self.stored, spec)
                    self._materialized.add(spec)
            return con.sql(query, params=params or None)
        except duckdb.Error as error:
            raise query_error(con, self.uri, query, error) from None

    def _check_files(self) -> None:
        """DuckDB skips Parquet page checksums: the file versions not found intact lately
        are read first (``require_intact``; a damaged committed file raises). A derived
        table found damaged (or mended) since the connection was made gets its view made
        again, failing with its line only for the queries that read it."""
        from pipeline.lookup.sql import checked_damage, derived_views

        damaged = checked_damage(self.uri, self.storage_options)
        if damaged != self._damaged:
            self._damaged = damaged
            if self._con is not None:
                derived_views(self._con, self.stored, damaged)

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection ``sql`` uses, its views made once, through this dataset's
        file system (so with its ``storage_options``)."""
        if self._con is None:
            import duckdb

            from pipeline.lookup.sql import connect, connection_error

            try:
                self._con = connect(self.stored, damaged=self._damaged)
            except duckdb.Error as error:
                raise connection_error(self.uri, error) from None
        return self._con

    def close(self) -> None:
        """Close the SQL connection (relations from ``sql`` can no longer be fetched)."""
        if self._con is not None:
            self._con.close()
            self._con = None


class IndexReader:
    """A sense index (``pipeline.build_index``, ``elmo index build``): occurrences of a
    word searched by meaning and clustered into senses."""

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        from pipeline.lookup.index.sense_index import SenseIndex

        self.index: SenseIndex = SenseIndex(uri, storage_options)
        self._embedder: Any = None  # the dataset's model, loaded by the first search
        self._passages: Any = None  # the pooled tables, held by the first passage search

    def search(self, sentence: str, word: str | None = None, k: int = 10,
               any_word: bool = False, where: Filters = None,
               exact: bool = False) -> list[Hit]:
        """The ``k`` occurrences nearest in meaning to ``word`` as used in ``sentence``,
        each with its sentence, document fields and similarity: uses of the same word in
        any of its forms, or with ``any_word`` of every word. ``word`` None: the sentence
        is the word (``search("bank")``). ``where``: conditions on document fields
        (``"year=1861..1865"``, ``["party=A|B", "year>=1900"]`` or a mapping);
        ``exact``: compare every candidate rather than ask the ANN index."""
        from pipeline.lookup.senses.search import search_senses

        if word is None:
            if len(sentence.split()) != 1:
                raise SettingError("word", lambda name: (
                    f"name the word of the sentence to search for ({name('word')}=...); "
                    "without it the sentence must be one word"))
            word = sentence.strip()
        if self._embedder is None:
            import elmo_model
            from pipeline.lookup.senses.search import model_files_for

            self._embedder = elmo_model.load(*model_files_for(self.index.dataset_descriptor()),
                                             mode="stateless")
        return search_senses(self.index, sentence, word, k=k,
                             match="any" if any_word else "forms", exact=exact,
                             embedder=self._embedder, filters=where)

    def senses(self, word: str, k: int | str = "auto", where: Filters = None
               ) -> ClusterResult:
        """``word``'s occurrences clustered into ``k`` senses (``"auto"``: the number the
        silhouette prefers), each named by its typical context words, with examples."""
        from pipeline.lookup.senses.clusters import cluster_senses

        return cluster_senses(self.index, [word], k=k, filters=where)

    def change(self, by: str, bin: float | None = None, *,
               words: Sequence[str] | None = None, top: int | None = None,
               min_uses: int | None = None) -> ChangeRanking:
        """Words ranked by how differently they are used across the groups of document
        field ``by`` (numbers in bins of ``bin``): ``elmo senses change --by``. ``words``:
        only these; ``min_uses``: the uses a word needs in two groups (default 20)."""
        from pipeline.lookup.senses.change import word_changes

        given = {} if min_uses is None else {"min_uses": min_uses}
        return word_changes(self.index, by, bin, words=words, top=top, **given)

    def search_passages(self, text: str, k: int = 10, by: str = "sentence",
                        mix: str | None = None, method: str | None = None,
                        where: Filters = None) -> list[Passage]:
        """The ``k`` sentences (or documents) of the index's dataset whose pooled vectors
        (``elmo pool``) are nearest to ``text``'s, with their text and document fields;
        ``mix`` and ``method``: the pooled table's (default: the pooling defaults);
        ``where``: conditions on document fields, as ``search`` takes them."""
        from pipeline.lookup.pooled.pooling import DEFAULT_METHOD, DEFAULT_MIX
        from pipeline.lookup.pooled.search import PassageSearch

        if self._passages is None:
            self._passages = PassageSearch(self.index.meta.dataset,
                                           storage_options=self.index.storage_options)
        return self._passages.search(text, k=k, by=by, mix=mix or DEFAULT_MIX,
                                     method=method or DEFAULT_METHOD, filters=where)


def _filtered(rows: pa.Table, expression: Any) -> pa.Table:
    import pyarrow as pa

    try:
        return rows.filter(expression)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:
        reason = str(error).splitlines()[0]
        raise SettingError("filter", lambda name: f"{name('filter')}: {reason}") from None


def _table(table: str) -> str:
    if table not in TABLES:
        raise ElmoUserError(f"no table {table!r}; the tables are {', '.join(TABLES)}")
    return table


def _known(columns: Sequence[str], names: Sequence[str], table: str) -> list[str]:
    missing = [c for c in columns if c not in names]
    if missing:
        raise ElmoUserError(f"no column {', '.join(map(repr, missing))} in {table}; its "
                            f"columns are {', '.join(names)}")
    return list(columns)
