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
some words (``index_words``). An index of an older storage generation (``meta.stale_rows``,
a compact index's IVF not in shards) is refused when opened, in one line naming the build
that makes it again: no query carries a path of its own for it. Where the vectors are
searched is chosen once at open (``backends``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.doc_fields import (
    INDEX_FIELDS,
    DocumentTable,
    FieldFilter,
    fields_where,
)
from pipeline.lookup.index.backends import IndexBackend, RayShardBackend, backend_for
from pipeline.lookup.index.ivf_shards import SHARDS_FORMAT, is_sharded, projected
from pipeline.lookup.index.meta import (
    HELD_SENTENCES_MAX,
    INDEX_META,
    MAX_JOIN_IDS,
    RESULT_COLUMNS,
    STEMMER,
    WORD_COUNTS,
    build_command,
    lance_options,
    moved_dataset_fix,
    read_meta,
    stale_rows,
)
from pipeline.lookup.index.meta import TABLE as TABLE  # importable from here as before
from pipeline.lookup.index.publish import open_tables
from pipeline.lookup.index.sentences import (
    SENTENCE_KEY,
    read_all_texts,
    with_held_sentences,
    with_sentences,
)

# Words as the index's columns store them (stem_words: importable from here as before).
from pipeline.lookup.index.words import WordCounts, token_filter
from pipeline.lookup.index.words import stem_words as stem_words
from schemas.dataset import open_dataset, open_fs, read_dataset_descriptor
from schemas.mix_specs import Mix

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from pipeline.lookup.index.ivf_search import IvfSearch
    from pipeline.lookup.index.lance_search import VectorSearch
    from schemas import DatasetDescriptor


class SenseIndex:
    """An opened index: its metadata, LanceDB tables and search backend."""

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
        self._held_texts: dict[tuple[str, int], str] | None = None
        self._texts: Any = None  # ``_text_source``'s, once found
        self.selection = meta.selection()  # which words it holds
        fs, root = open_fs(uri, storage_options)
        self.word_counts = WordCounts(fs, f"{root}/{meta.word_counts_file or WORD_COUNTS}",
                                      current=meta.counted_rows == meta.rows > 0)
        self._documents: DocumentTable | None = None
        # False: a full index's every search goes to LanceDB (benchmarks compare the two).
        self.use_ivf = True
        self.backend: IndexBackend = backend_for(self)

    @property
    def table(self) -> Any:
        """The index's LanceDB table of token rows."""
        return self._lance()[0]

    @property
    def sentences(self) -> Any:
        """Its sentence texts' table."""
        return self._lance()[1]

    def _lance(self) -> tuple[Any, Any]:
        if self._tables is None:
            import lancedb

            db = lancedb.connect(self.uri, storage_options=lance_options(self.storage_options))
            # At the versions the JSON names: what a build under way (or stopped) wrote
            # since is not this index (``publish``).
            self._tables = open_tables(db, self.meta, self.uri)
        return self._tables

    def ivf(self) -> Any:
        """The IVF its searches use, loaded on first use (``backends``): a full index's
        in-memory IVF or None (LanceDB answers), a compact index's IVF in shards."""
        return self.backend.ivf()

    def require_current_layout(self) -> None:
        """An index of an earlier storage generation (rows of an older layout, a compact
        index's IVF not in shards of int8 vectors) is refused in one line that names the
        build making it again: no query takes a path of its own for it."""
        held, stale = self.meta.ivf, stale_rows(self.meta)
        if stale is not None:
            raise ElmoUserError(f"{self.uri} is an index of an older layout (built {stale}): "
                                f"{self.build_command()} makes it again in the current one")
        if self.meta.compact and held is not None and not is_sharded(held):
            raise ElmoUserError(
                f"{self.uri} is a compact index of an older layout (IVF format "
                f"{held.get('format')}; this version reads {SHARDS_FORMAT}): "
                f"{self.build_command()} makes it again in the current one")
        if self.meta.compact and held is not None and not projected(held):
            raise ElmoUserError(
                f"{self.uri} is a compact index whose codes predate their projection (its "
                f"searches would re-rank up to 12x the candidates): {self.build_command()} "
                "trains them again, keeping its rows")

    def build_command(self, then: str = "") -> str:
        """The build that brings this index up to date (and its IVF with it), ``then``:
        further flags."""
        return build_command(self.meta, self.uri, then)

    def search_with(self, ivf: Any) -> None:
        """Answer this compact index's searches with ``ivf`` (``ivf_ray.RayIvf``)."""
        self.backend, self._texts = RayShardBackend(self, ivf), None

    def prepare_search(self, words: Sequence[str] | None, column: str,
                       where: str | None) -> None:
        """Ready a search of ``words`` (and ``where``) before its query vector is known (a
        compact index reads the words' rows and their IVF meanwhile)."""
        self.backend.prepare(words, column, where)

    def stored(self, columns: Sequence[str]) -> list[str]:
        """``columns`` the token rows hold (``sentence`` comes from the sentences table)."""
        if "sentence" not in columns:
            return list(columns)
        # The sentence's key, to fetch its text by.
        return [c for c in columns if c != "sentence"] + \
            [c for c in SENTENCE_KEY if c not in columns]

    def completed(self, columns: Sequence[str]) -> Any:
        """What turns rows of ``stored(columns)`` into rows of ``columns`` (None: nothing)."""
        if "sentence" not in columns:
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
        if self._held_texts is None \
                and self._text_source().count_rows() <= max_rows:
            self._held_texts = read_all_texts(self._text_source())
        return self._held_texts is not None

    def _text_source(self) -> Any:
        """Where sentence texts are read: the backend's (a compact IVF's shards' files:
        mapped, no LanceDB), else the sentences table."""
        if self._texts is None:
            self._texts = self.backend.sentence_texts() or self.sentences
        return self._texts

    def require_indexed(self, words: Sequence[str], column: str) -> None:
        """A word this index does not hold (it selected others) is a user error."""
        selection = self.selection
        if selection.everything or self.word_rows(words, column) > 0:
            return
        raise ElmoUserError(
            f"{' / '.join(words)} is not in this index: it holds {selection.describe()}; "
            f"rebuild it with the word ({self.build_command('--rebuild --words ...')})")

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
        if self.meta.stored_fields() is None or self.meta.doc_fields is None:
            # Compact (fields joined by doc_id), or described by `elmo index info` though
            # built before document fields were stored.
            return {"doc_id": "string"}
        return {**dict.fromkeys(INDEX_FIELDS, "string"), **self.meta.doc_fields}

    def fields_where(self, filters: Sequence[FieldFilter]) -> str | None:
        """A Lance predicate for document-field ``filters`` (``doc_fields.fields_where``)."""
        return fields_where(filters, self.indexed_fields(), self.documents, MAX_JOIN_IDS,
                            self.build_command("--rebuild"))

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
        column. The backend chosen at open answers it (``backends``)."""
        import numpy as np

        column = "token_stem" if forms else "token_lower"
        if k < 1:
            raise SettingError("k", lambda name: f"{name('k')} must be at least 1")
        vectors = np.asarray(vectors, np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.meta.dim:
            raise ElmoUserError(f"query vector has {vectors.shape[-1]} values, index has "
                                f"{self.meta.dim}")
        if words:
            self.require_indexed(words, column)
        return self.backend.query(vectors, k, words, column, exact, tuple(self.stored(columns)),
                                  self.completed(columns), where)

    def occurrences(self, words: Sequence[str], columns: Sequence[str] = RESULT_COLUMNS,
                    limit: int = 100_000, where: str | None = None,
                    column: str = "token_lower") -> pa.Table:
        """Every row whose ``column`` (the lowercase token, or ``token_stem`` for any of a
        word's forms) is one of ``words``, with vectors, and that passes ``where`` (a
        Lance predicate, ``fields_where``) if given."""
        self.require_indexed(words, column)
        found = self.backend.occurrences(words, column, where, self.stored(columns), limit)
        complete = self.completed(columns)
        return found if complete is None else complete(found)
