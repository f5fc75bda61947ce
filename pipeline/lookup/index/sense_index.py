"""A LanceDB index of mixed token vectors, for contextual-sense search.

    elmo index build data/ds --mix top --out data/ds-top.lance

One row per indexed token: ``vector`` (the mix, float16), ``token``, ``token_lower``,
``token_stem`` (the Snowball English stem of ``token_lower``: plays, played and playing
are all ``play``), ``doc_id``, ``sent_idx``, ``tok_idx``, ``part``, ``shard`` and
``start``/``end`` (the token's character span inside its sentence, for highlighting;
the sentence text is in table ``sentences``, fetched by ``doc_id, sent_idx``), then its
document's ``source`` and metadata fields as ``meta_<name>`` columns (``doc_fields``:
the fields whose values were all numbers or all text when the index was created), so that
searches filter on them before the vector search. Scalar BTree indexes on ``token``,
``token_lower`` and ``token_stem`` make ``token_stem = ...`` prefilters (a word and its
forms) cheap.

Vector index (``--index``): ``flat`` (none: exact brute-force search), ``hnsw``
(IVF_HNSW_SQ, cosine) or ``auto`` (hnsw from ``HNSW_MIN_ROWS`` rows on, else flat). A
prefiltered query whose filter leaves at most ``EXACT_FILTER_VALUES`` floats runs exact
over just those rows; above that, the prefiltered graph search (BENCHMARKS.md).

``<out>/_elmo_index.json`` records the dataset, its model fingerprint, the mix (weights in
full), the search parameters and which committed shard files are in it. Building again
brings the index to the dataset's committed view incrementally (LanceDB ``delete`` /
``add`` / ``optimize``); only a changed mix needs ``--rebuild``. Each build rewrites
``<out>/_word_counts.parquet`` (rows per lowercase token and stem: filtered queries are
routed without a count query).

A compact index (the default: ``compact`` in the JSON, ``built`` ``ivf``; ``--full`` makes
the other kind) keeps no vectors in LanceDB: its rows hold ``row`` (the token's row in its
shard's tokens file), and its IVF in shards (``ivf_shards``) holds product-quantized
codes, the mixed vectors in files read by row, and the rows and sentences in Arrow files, so
that a search of a word needs no LanceDB; a further filter (``--where``) is LanceDB's.
Layout 2 (``LAYOUT``) stores each sentence once (``index_sentences``) and may hold only
some words (``index_words``); older indexes are read as they are, or rebuilt by the next
build when their rows lack stems or document fields.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.doc_fields import (
    INDEX_FIELDS,
    DocumentTable,
    FieldFilter,
    fields_where,
)
from pipeline.lookup.index.ivf_search import IVF_DIR, IvfSearch, MemoryIvf, current
from pipeline.lookup.index.ivf_shards import (
    SENTENCES_FILE,
    SHARDS_FORMAT,
    ShardedIvf,
    is_sharded,
)
from pipeline.lookup.index.lance_search import VectorSearch
from pipeline.lookup.index.meta import (
    EXACT_FILTER_VALUES,
    HELD_SENTENCES_MAX,
    INDEX_META,
    MAX_JOIN_IDS,
    RESULT_COLUMNS,
    STEMMER,
    WORD_COUNTS,
    lance_options,
    moved_dataset_fix,
    read_meta,
)
from pipeline.lookup.index.meta import TABLE as TABLE  # importable from here as before
from pipeline.lookup.index.publish import open_tables
from pipeline.lookup.index.sentences import (
    SENTENCE_KEY,
    ShardSentences,
    read_all_texts,
    with_held_sentences,
    with_sentences,
)

# Words as the index's columns store them (stem_words: importable from here as before).
from pipeline.lookup.index.words import WordCounts, column_words, token_filter
from pipeline.lookup.index.words import stem_words as stem_words
from pipeline.lookup.layers.vectors import unit_vectors
from schemas.dataset import open_dataset, open_fs, read_dataset_descriptor
from schemas.mix_specs import Mix

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from schemas import DatasetDescriptor


class SenseIndex:
    """An opened index: its metadata and LanceDB table."""

    def __init__(self, uri: str, storage_options: dict | None = None, *,
                 any_layout: bool = False) -> None:
        """``any_layout``: open an index of an older storage generation too (to describe
        it: ``elmo index info``); else that is refused here, in one line naming the build
        that makes it again (``require_current_layout``)."""
        meta = read_meta(uri, storage_options)
        if meta is None:
            raise ElmoUserError(f"{uri} is not an elmo sense index (no {INDEX_META}); "
                                "build one with `elmo index build`")
        self.uri, self.meta, self.storage_options = uri, meta, storage_options
        if not any_layout:
            self.require_current_layout()
        # LanceDB is opened on first use (a compact index's word search needs none of it).
        self._tables: tuple[Any, Any] | None = None
        self._positions: tuple[tuple[str, tuple[str, ...]], np.ndarray] | None = None
        self._held_texts: dict[tuple[str, int], str] | None = None
        self._texts: Any = None  # ``_text_source``'s, once found
        self.selection = meta.selection()  # which words it holds
        fs, root = open_fs(uri, storage_options)
        self.word_counts = WordCounts(fs, f"{root}/{meta.word_counts_file or WORD_COUNTS}",
                                      current=meta.counted_rows == meta.rows > 0)
        self._documents: DocumentTable | None = None
        self._ivf: MemoryIvf | None = None
        self._ivf_tried = False
        # False: every search goes to LanceDB (benchmarks compare the two paths).
        self.use_ivf = True

    @property
    def table(self) -> Any:
        """The index's LanceDB table of token rows."""
        return self._lance()[0]

    @property
    def sentences(self) -> Any:
        """Its sentence texts' table (layout 2), or None (layout 1: texts in every row)."""
        return self._lance()[1] if self.meta.layout >= 2 else None

    def _lance(self) -> tuple[Any, Any]:
        if self._tables is None:
            import lancedb

            db = lancedb.connect(self.uri, storage_options=lance_options(self.storage_options))
            # At the versions the JSON names: what a build under way (or stopped) wrote
            # since is not this index (``publish``).
            self._tables = open_tables(db, self.meta, self.uri)
        return self._tables

    def ivf(self) -> MemoryIvf | None:
        """The in-memory IVF (loaded on first use), or None when the index has none, its
        table changed after it was made, or its files cannot be read (then LanceDB answers,
        and one line on stderr says how to make it again). A compact index's has no
        fallback: those cases are errors (``_compact_ivf``)."""
        if self.meta.compact:
            return self._compact_ivf()
        if not self._ivf_tried:
            self._ivf_tried = True
            held = self.meta.ivf
            if held is not None and current(held, self.table.version):
                fs, root = open_fs(self.uri, self.storage_options)
                folder = f"{root}/{IVF_DIR}/{held['folder']}"
                try:
                    self._ivf = MemoryIvf.load(fs, folder, held["nprobe"])
                except (OSError, RuntimeError, ValueError) as error:
                    print(f"elmo: {self.uri}: in-memory IVF unreadable ({error}); searching "
                          f"with LanceDB. `elmo index build {self.meta.dataset} --mix "
                          f"{self.meta.mix_name} --out {self.uri}` makes it again",
                          file=sys.stderr)
        return self._ivf

    def _compact_ivf(self) -> ShardedIvf:
        """A compact index's IVF (on first use): what stops it is an error naming the fix."""
        if self._ivf is None:
            held = self.meta.ivf
            self.require_current_layout()
            if held is None:
                raise ElmoUserError(f"{self.uri}: the compact index's IVF is missing (a build "
                                    f"stopped half way); {self._rebuild()} makes it again")
            # A file the table holds and the IVF does not (an IVF older than its table):
            # a search would leave its rows out without a word.
            for part, shard, _ in (k.split("/") for k in self.meta.indexed
                                   if k not in held["shards"]):
                raise ElmoUserError(f"index shard {part}/{shard} is missing or stale (the IVF "
                                    f"holds no such file, which the index's table has); "
                                    f"{self._rebuild()} makes it again")
            fs, root = open_fs(self.uri, self.storage_options)
            self._ivf = ShardedIvf.load(fs, root, held, self._rebuild())
        return self._ivf  # type: ignore[return-value]

    def require_current_layout(self) -> None:
        """A compact index of an earlier storage generation (its IVF not in shards of int8
        vectors) is refused in one line that names the build making it again: no query
        takes a slow path of its own for it."""
        held = self.meta.ivf
        if self.meta.compact and held is not None and not is_sharded(held):
            raise ElmoUserError(
                f"{self.uri} is a compact index of an older layout (IVF format "
                f"{held.get('format')}; this version reads {SHARDS_FORMAT}): "
                f"{self._rebuild()} makes it again in the current one")

    def _rebuild(self) -> str:
        return f"`elmo index build {self.meta.dataset} --mix {self.meta.mix_name} --out " \
            f"{self.uri}`"

    def search_with(self, ivf: Any) -> None:
        """Answer this compact index's searches with ``ivf`` (``ivf_ray.RayIvf``)."""
        self._ivf, self._texts = ivf, None

    def _compact_positions(self, where: str) -> np.ndarray:
        """Positions in the compact IVF of the rows that pass ``where``."""
        # Only the keys: an empty selection would read every column.
        ivf = self._compact_ivf()
        keys = (self.table.search().where(where).select(["part", "shard", "row"])
                .limit(max(1, self.meta.rows)).to_arrow())
        return ivf.positions_of_keys(keys)

    def finds_words_in_shards(self, words: Sequence[str] | None, where: str | None) -> bool:
        """Whether a search of ``words`` (and ``where``) takes their rows from the shards'."""
        return bool(words) and where is None and self.meta.compact

    def word_positions(self, words: Sequence[str], column: str) -> np.ndarray:
        """IVF positions of the rows whose ``column`` is one of ``words`` (from the shards'
        rows: no LanceDB), kept with the IVF of only those rows for the next search."""
        if self._positions is None or self._positions[0] != (column, tuple(words)):
            ivf = self._compact_ivf()
            if isinstance(ivf, ShardedIvf):
                found = ivf.rows.positions_in(column, column_words(words, column))
                ivf.prepare_filter(found)
            else:  # a Ray-held IVF: the keys from LanceDB
                found = self._compact_positions(token_filter(words, column))
            self._positions = ((column, tuple(words)), found)
        return self._positions[1]

    def stored(self, columns: Sequence[str]) -> list[str]:
        """``columns`` the token rows hold (``sentence`` comes from the sentences table)."""
        if self.meta.layout < 2 or "sentence" not in columns:
            return list(columns)
        # The sentence's key, to fetch its text by.
        return [c for c in columns if c != "sentence"] + \
            [c for c in SENTENCE_KEY if c not in columns]

    def completed(self, columns: Sequence[str]) -> Any:
        """What turns rows of ``stored(columns)`` into rows of ``columns`` (None: nothing)."""
        if self.meta.layout < 2 or "sentence" not in columns:
            return None
        held = self._held_texts
        sentences = self._text_source() if held is None else None
        added = [c for c in SENTENCE_KEY if c not in columns]  # by ``stored``, for the text

        def complete(rows: pa.Table) -> pa.Table:
            rows = with_held_sentences(held, rows) if held is not None \
                else with_sentences(sentences, rows)
            return rows.drop_columns(added)

        return complete

    def hold_sentences(self, max_rows: int = HELD_SENTENCES_MAX) -> bool:
        """Read every sentence text into memory now if there are at most ``max_rows``
        (a server: each result then reads none); whether they are held."""
        if self.meta.layout >= 2 and self._held_texts is None \
                and self._text_source().count_rows() <= max_rows:
            self._held_texts = read_all_texts(self._text_source())
        return self._held_texts is not None

    def _text_source(self) -> Any:
        """Where sentence texts are read: the compact IVF's shards' files (mapped, no
        LanceDB; not for a Ray-held IVF or older shards), else the sentences table."""
        if self._texts is None:
            ivf = self._compact_ivf() if self.meta.compact else None
            self._texts = (ShardSentences.of(ivf.folders, SENTENCES_FILE)
                           if isinstance(ivf, ShardedIvf) else None) or self.sentences
        return self._texts

    def require_indexed(self, words: Sequence[str], column: str) -> None:
        """A word this index does not hold (it selected others) is a user error."""
        selection = self.selection
        if selection.everything or self.word_rows(words, column) > 0:
            return
        raise ElmoUserError(
            f"{' / '.join(words)} is not in this index: it holds {selection.describe()}; "
            f"rebuild it with the word (`elmo index build {self.meta.dataset} --mix "
            f"{self.meta.mix_name} --out {self.uri} --rebuild --words ...`)")

    @property
    def has_stems(self) -> bool:
        return self.meta.stemmer == STEMMER

    def dataset_descriptor(self) -> DatasetDescriptor:
        """The descriptor of the dataset the index was built from (a query is embedded with
        its model and tokenizer), or an error naming the index and the fix."""
        try:
            return read_dataset_descriptor(self.meta.dataset, self.storage_options)
        except (ElmoUserError, OSError) as error:
            raise ElmoUserError(f"{self.uri} was built from {self.meta.dataset}, which is not "
                                f"readable now ({error}); "
                                f"{moved_dataset_fix(self.meta.mix_name, self.uri)}"
                                ) from error

    def require_stems(self) -> None:
        if not self.has_stems:
            raise ElmoUserError(
                f"{self.uri} was built before word forms were indexed; rebuild it with "
                f"`elmo index build {self.meta.dataset} --mix {self.meta.mix_name} --out "
                f"{self.uri} --rebuild`, or search the exact word (--same-form)")

    def word_rows(self, words: Sequence[str], column: str = "token_lower") -> int:
        """Rows that ``token_filter(words, column)`` keeps (``token_lower``: the words in any
        case; ``token_stem``: their forms): the build's counts, else a count query."""
        if column not in ("token_lower", "token_stem"):
            raise ValueError(f"word_rows counts token_lower or token_stem, not {column!r}")
        counted = self.word_counts.rows(words, column)
        return self.table.count_rows(token_filter(words, column)) if counted is None \
            else counted

    @property
    def mix(self) -> Mix:
        return self.meta.the_mix()

    def documents(self) -> DocumentTable:
        """The dataset's documents and their fields (read on first use, then kept)."""
        if self._documents is None:
            try:
                self._documents = DocumentTable(open_dataset(self.meta.dataset,
                                                             self.storage_options))
            except (ElmoUserError, OSError) as error:
                # Clusters need only the index: without its dataset they show no fields.
                self._documents = DocumentTable(None, f"the index's dataset is not readable "
                                                      f"({error})")
        return self._documents

    def indexed_fields(self) -> dict[str, str]:
        """Document fields this index's rows hold (name -> kind), filtered by LanceDB."""
        stored = self.meta.stored_fields()
        if self.meta.doc_fields is None or stored is None:
            # Built before document fields were stored, or compact: fields joined by doc_id.
            return {"doc_id": "string"}
        return {**dict.fromkeys(INDEX_FIELDS, "string"), **self.meta.doc_fields}

    def fields_where(self, filters: Sequence[FieldFilter]) -> str | None:
        """A Lance predicate for document-field ``filters`` (``doc_fields.fields_where``)."""
        return fields_where(filters, self.indexed_fields(), self.documents, MAX_JOIN_IDS,
                            f"`elmo index build {self.meta.dataset} --out {self.uri} "
                            "--rebuild`")

    def search(self, vector: np.ndarray, k: int = 10, words: Sequence[str] | None = None,
               exact: bool = False, columns: Sequence[str] = RESULT_COLUMNS,
               forms: bool = False, where: str | None = None) -> pa.Table:
        """Nearest tokens by cosine; ``words``: only tokens whose lowercase form is one of
        them, or with ``forms`` any form of them (same stem: plays, played, playing);
        ``where``: a further Lance predicate (``fields_where``), also a prefilter.
        Returns the columns plus ``_distance`` (cosine distance), nearest first."""
        import numpy as np

        vector = np.asarray(vector, np.float32).reshape(1, -1)
        return self.vector_query(vector, k, words, exact, columns, forms, where).to_arrow()

    def vector_query(self, vectors: np.ndarray, k: int = 10,
                     words: Sequence[str] | None = None, exact: bool = False,
                     columns: Sequence[str] = RESULT_COLUMNS, forms: bool = False,
                     where: str | None = None) -> VectorSearch | IvfSearch:
        """The search ``search`` runs, for ``[n, dim]`` query vectors (``to_arrow`` runs
        it): with more than one, they are answered in one call with a ``query_index``
        column. Without a prefilter it goes to the in-memory IVF when the index has one
        (``ivf``), else to LanceDB."""
        import numpy as np

        if forms and words:
            self.require_stems()
        column = "token_stem" if forms else "token_lower"
        if k < 1:
            raise SettingError("k", lambda name: f"{name('k')} must be at least 1")
        vectors = np.asarray(vectors, np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.meta.dim:
            raise ElmoUserError(f"query vector has {vectors.shape[-1]} values, index has "
                                f"{self.meta.dim}")
        if words:
            self.require_indexed(words, column)
        word_where = token_filter(words, column) if words else None
        if self.meta.compact:
            if self.finds_words_in_shards(words, where):
                return IvfSearch(self._compact_ivf(), vectors, k, tuple(self.stored(columns)),
                                 self.completed(columns), exact=exact,
                                 among=self.word_positions(words, column))
            where = " AND ".join(f"({w})" for w in (word_where, where) if w) or None
            among = None if where is None else self._compact_positions(where)
            return IvfSearch(self._compact_ivf(), vectors, k, tuple(self.stored(columns)),
                              self.completed(columns), among=among, exact=exact)
        if where is not None:
            # Rows the whole filter leaves (a count query: the word counts do not know it).
            where = f"({word_where}) AND ({where})" if word_where else where
            small = self.table.count_rows(where) * self.meta.dim <= EXACT_FILTER_VALUES
        else:
            where = word_where
            small = where is not None and self.word_rows(words, column) * self.meta.dim \
                <= EXACT_FILTER_VALUES
        graph = not (exact or self.meta.built != "hnsw" or small)
        stored = tuple(self.stored(columns))
        if graph and where is None and self.use_ivf:
            held = self.ivf()
            if held is not None and held.holds(stored):
                return IvfSearch(held, vectors, k, stored, self.completed(columns))
        return VectorSearch(self.table, vectors, k, stored, where,
                            self.meta.search if graph else None, self.completed(columns))

    def occurrences(self, words: Sequence[str], columns: Sequence[str] = RESULT_COLUMNS,
                    limit: int = 100_000, where: str | None = None,
                    column: str = "token_lower") -> pa.Table:
        """Every row whose ``column`` (the lowercase token, or ``token_stem`` for any of a
        word's forms) is one of ``words``, with vectors, and that passes ``where`` (a
        Lance predicate, ``fields_where``) if given."""
        self.require_indexed(words, column)
        if self.meta.compact:
            found = self._compact_occurrences(words, column, where, self.stored(columns),
                                              limit)
        else:
            words_where = token_filter(words, column)
            where = words_where if where is None else f"({words_where}) AND ({where})"
            found = (self.table.search().where(where).select([*self.stored(columns), "vector"])
                     .limit(limit).to_arrow())
        complete = self.completed(columns)
        return found if complete is None else complete(found)

    def _compact_occurrences(self, words: Sequence[str], column: str, where: str | None,
                             columns: Sequence[str], limit: int) -> pa.Table:
        """``occurrences`` of a compact index with a ``vector`` column: in shards, rows and
        vectors by IVF position from its files (LanceDB only for ``where``)."""
        import pyarrow as pa

        held, words_where = self._compact_ivf(), token_filter(words, column)
        both = words_where if where is None else f"({words_where}) AND ({where})"
        if isinstance(held, ShardedIvf):
            positions = (self.word_positions(words, column) if where is None
                         else self._compact_positions(both))[:limit]
            rows, vectors = held.take_rows(columns, positions), held.vectors[positions]
        else:  # a Ray-held IVF: the rows from LanceDB, their vectors by key
            keys = [c for c in ("part", "shard", "row") if c not in columns]
            rows = self.table.search().where(both).select([*columns, *keys]).limit(limit) \
                .to_arrow()
            vectors = held.vectors[held.positions_of_keys(rows)]
            rows = rows.drop_columns(keys)
        if len(vectors) != rows.num_rows:
            # Rows and vectors pair by place: a count that differs pairs them wrongly.
            raise ElmoUserError(f"{self.uri}: {rows.num_rows} rows but {len(vectors)} vectors "
                                f"from its IVF (the IVF is stale); {self._rebuild()} makes "
                                "it again")
        # Shards store int8 vectors without their scale: the occurrences' vectors are
        # their directions (unit, float32), all cosine geometry needs.
        return rows.append_column(
            "vector", pa.FixedSizeListArray.from_arrays(
                pa.array(unit_vectors(vectors).reshape(-1)), held.dim))
