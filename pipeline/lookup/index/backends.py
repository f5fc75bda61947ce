"""Where a sense index's vectors are searched, chosen once when it opens
(``SenseIndex.__init__``, ``backend_for``): a full index's are LanceDB's (its HNSW or an
exact scan, or the in-memory IVF made beside the table: ``LanceBackend``); a compact
index's are its IVF in shards (``ShardBackend``), or those shards held by Ray actors
(``RayShardBackend``, given by ``SenseIndex.search_with``). ``SenseIndex`` checks a
query (k, the vectors' width, the words it holds) and hands it to its backend; no query
path asks which kind of index it is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.ivf_search import IVF_DIR, IvfSearch, MemoryIvf, current
from pipeline.lookup.index.ivf_shards import SENTENCES_FILE, ShardedIvf
from pipeline.lookup.index.lance_search import VectorSearch
from pipeline.lookup.index.meta import EXACT_FILTER_VALUES
from pipeline.lookup.index.sentences import ShardSentences
from pipeline.lookup.index.words import column_words, token_filter
from pipeline.lookup.layers.vectors import unit_vectors
from schemas.dataset import open_fs

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from pipeline.lookup.index.meta import IndexMeta

Then = Callable[["pa.Table"], "pa.Table"] | None


def both(first: str | None, second: str | None) -> str | None:
    """Two Lance predicates (either may be None) as one."""
    given = [w for w in (first, second) if w]
    return " AND ".join(f"({w})" for w in given) if len(given) > 1 \
        else given[0] if given else None


class OpenedIndex(Protocol):
    """What a backend uses of the index it serves (``sense_index.SenseIndex``)."""

    uri: str
    storage_options: dict | None
    meta: IndexMeta
    use_ivf: bool  # False: a full index's every search goes to LanceDB

    @property
    def table(self) -> Any: ...

    def word_rows(self, words: Sequence[str], column: str = "token_lower") -> int: ...

    def build_command(self, then: str = "") -> str: ...


class IndexBackend(Protocol):
    """What an opened index searches with."""

    def ivf(self) -> Any:
        """The IVF it holds in memory (loaded on first use), or None."""

    def prepare(self, words: Sequence[str] | None, column: str, where: str | None) -> None:
        """Ready a search of ``words`` (and ``where``) before the query vector comes."""

    def query(self, vectors: np.ndarray, k: int, words: Sequence[str] | None, column: str,
              exact: bool, columns: Sequence[str], then: Then, where: str | None
              ) -> VectorSearch | IvfSearch:
        """The ``k`` nearest of the rows whose ``column`` is one of ``words`` (None: any)
        and that pass ``where``, exact or not: ``SenseIndex.vector_query``'s search."""

    def occurrences(self, words: Sequence[str], column: str, where: str | None,
                    columns: Sequence[str], limit: int) -> pa.Table:
        """Up to ``limit`` rows of ``words`` passing ``where``, with a ``vector`` column."""

    def sentence_texts(self) -> Any:
        """Where it reads sentence texts from, when not the sentences table (None)."""

    # The columns of a token row that find its vector (``vectors_of``).
    vector_columns: tuple[str, ...]

    def vectors_of(self, rows: pa.RecordBatch | pa.Table) -> np.ndarray:
        """The float32 ``[n, dim]`` vectors of ``rows`` (of ``vector_columns``)."""


def backend_for(index: OpenedIndex) -> IndexBackend:
    """The backend of an index, by the kind it was built as."""
    return ShardBackend(index) if index.meta.compact else LanceBackend(index)


class LanceBackend:
    """A full index: LanceDB's vector search (graph, or exact for a small filter), or the
    in-memory IVF without a filter when the index has one."""

    vector_columns = ("vector",)  # the rows hold their vectors

    def __init__(self, index: OpenedIndex) -> None:
        self.index = index
        self._ivf: MemoryIvf | None = None
        self._tried = False

    def ivf(self) -> MemoryIvf | None:
        """None when the index has none, its table changed after it was made, or its files
        cannot be read (then LanceDB answers, and one line on stderr says how to make it
        again)."""
        if not self._tried:
            self._tried = True
            ix, held = self.index, self.index.meta.ivf
            if held is not None and current(held, ix.table.version):
                fs, root = open_fs(ix.uri, ix.storage_options)
                try:
                    self._ivf = MemoryIvf.load(fs, f"{root}/{IVF_DIR}/{held['folder']}",
                                               held["nprobe"])
                except (OSError, RuntimeError, ValueError) as error:
                    print(f"elmo: {ix.uri}: in-memory IVF unreadable ({error}); searching "
                          f"with LanceDB. {ix.build_command()} makes it again",
                          file=sys.stderr)
        return self._ivf

    def prepare(self, words: Sequence[str] | None, column: str, where: str | None) -> None:
        return None

    def query(self, vectors: np.ndarray, k: int, words: Sequence[str] | None, column: str,
              exact: bool, columns: Sequence[str], then: Then, where: str | None
              ) -> VectorSearch | IvfSearch:
        ix = self.index
        word_where = token_filter(words, column) if words else None
        if where is not None:
            # Rows the whole filter leaves (a count query: the word counts do not know it).
            where = both(word_where, where)
            small = ix.table.count_rows(where) * ix.meta.dim <= EXACT_FILTER_VALUES
        else:
            where = word_where
            small = words is not None and where is not None \
                and ix.word_rows(words, column) * ix.meta.dim <= EXACT_FILTER_VALUES
        graph = not (exact or ix.meta.built != "hnsw" or small)
        if graph and where is None and ix.use_ivf:
            held = self.ivf()
            if held is not None and held.holds(columns):
                return IvfSearch(held, vectors, k, columns, then)
        return VectorSearch(ix.table, vectors, k, columns, where,
                            ix.meta.search if graph else None, then)

    def occurrences(self, words: Sequence[str], column: str, where: str | None,
                    columns: Sequence[str], limit: int) -> pa.Table:
        return (self.index.table.search().where(both(token_filter(words, column), where))
                .select([*columns, "vector"]).limit(limit).to_arrow())

    def sentence_texts(self) -> Any:
        return None

    def vectors_of(self, rows: pa.RecordBatch | pa.Table) -> np.ndarray:
        import numpy as np

        vectors = rows.column("vector").flatten().to_numpy(zero_copy_only=False)
        return vectors.reshape(rows.num_rows, -1).astype(np.float32)


class ShardBackend:
    """A compact index: its IVF in shards answers every search; LanceDB only picks the
    rows of a further filter (``where``)."""

    # The rows hold the keys of their vectors' rows in the IVF's files.
    vector_columns = ("part", "shard", "row")

    def __init__(self, index: OpenedIndex) -> None:
        self.index = index
        self._ivf: Any = None
        self._positions: tuple[tuple[str, tuple[str, ...]], np.ndarray] | None = None

    def ivf(self) -> Any:
        """Loaded on first use; what stops it is an error naming the fix."""
        if self._ivf is None:
            ix = self.index
            held = ix.meta.ivf
            if held is None:
                raise ElmoUserError(f"{ix.uri}: the compact index's IVF is missing (a build "
                                    f"stopped half way); {ix.build_command()} makes it again")
            # A file the table holds and the IVF does not (an IVF older than its table):
            # a search would leave its rows out without a word.
            for part, shard, _ in (k.split("/") for k in ix.meta.indexed
                                   if k not in held["shards"]):
                raise ElmoUserError(f"index shard {part}/{shard} is missing or stale (the IVF "
                                    f"holds no such file, which the index's table has); "
                                    f"{ix.build_command()} makes it again")
            fs, root = open_fs(ix.uri, ix.storage_options)
            self._ivf = ShardedIvf.load(fs, root, held, ix.build_command())
        return self._ivf

    def positions(self, where: str) -> np.ndarray:
        """Positions in the IVF of the rows that pass ``where``."""
        # Only the keys: an empty selection would read every column.
        keys = (self.index.table.search().where(where).select(["part", "shard", "row"])
                .limit(max(1, self.index.meta.rows)).to_arrow())
        return self.ivf().positions_of_keys(keys)

    def word_positions(self, words: Sequence[str], column: str) -> np.ndarray:
        """IVF positions of the rows whose ``column`` is one of ``words``, kept with the
        IVF of only those rows for the next search."""
        if self._positions is None or self._positions[0] != (column, tuple(words)):
            self._positions = ((column, tuple(words)), self._find_words(words, column))
        return self._positions[1]

    def _find_words(self, words: Sequence[str], column: str) -> np.ndarray:
        # From the shards' rows: no LanceDB.
        ivf = self.ivf()
        found = ivf.rows.positions_in(column, column_words(words, column))
        ivf.prepare_filter(found)
        return found

    def prepare(self, words: Sequence[str] | None, column: str, where: str | None) -> None:
        if words and where is None:
            self.word_positions(words, column)

    def query(self, vectors: np.ndarray, k: int, words: Sequence[str] | None, column: str,
              exact: bool, columns: Sequence[str], then: Then, where: str | None
              ) -> VectorSearch | IvfSearch:
        if words and where is None:
            among = self.word_positions(words, column)
        else:
            where = both(token_filter(words, column) if words else None, where)
            among = None if where is None else self.positions(where)
        return IvfSearch(self.ivf(), vectors, k, columns, then, among=among, exact=exact)

    def occurrences(self, words: Sequence[str], column: str, where: str | None,
                    columns: Sequence[str], limit: int) -> pa.Table:
        """Rows and vectors by IVF position from its files (LanceDB only for ``where``)."""
        held = self.ivf()
        positions = (self.word_positions(words, column) if where is None
                     else self.positions(both(token_filter(words, column), where)))[:limit]
        return self._with_vectors(held.take_rows(columns, positions), held.vectors[positions])

    def _with_vectors(self, rows: pa.Table, vectors: np.ndarray) -> pa.Table:
        import pyarrow as pa

        if len(vectors) != rows.num_rows:
            # Rows and vectors pair by place: a count that differs pairs them wrongly.
            raise ElmoUserError(f"{self.index.uri}: {rows.num_rows} rows but {len(vectors)} "
                                f"vectors from its IVF (the IVF is stale); "
                                f"{self.index.build_command()} makes it again")
        # Shards store int8 vectors without their scale: the occurrences' vectors are
        # their directions (unit, float32), all cosine geometry needs.
        return rows.append_column(
            "vector", pa.FixedSizeListArray.from_arrays(
                pa.array(unit_vectors(vectors).reshape(-1)), self.ivf().dim))

    def sentence_texts(self) -> Any:
        """The shards' sentence files (mapped: no LanceDB)."""
        return ShardSentences.of(self.ivf().folders, SENTENCES_FILE)

    def vectors_of(self, rows: pa.RecordBatch | pa.Table) -> np.ndarray:
        import numpy as np
        import pyarrow as pa

        ivf = self.ivf()
        table = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
        positions = ivf.positions_of_keys(table)
        if len(positions) != rows.num_rows:
            raise ElmoUserError(f"{self.index.uri}: the compact index's vector files miss "
                                f"rows of its table; {self.index.build_command()} makes them "
                                "again")
        return ivf.vectors[positions].astype(np.float32)


class RayShardBackend(ShardBackend):
    """A compact index whose shards Ray actors hold (``ivf_ray.RayIvf``): the rows of a
    word come from LanceDB, their vectors from the actors by key."""

    def __init__(self, index: OpenedIndex, ivf: Any) -> None:
        super().__init__(index)
        self._ivf = ivf

    def _find_words(self, words: Sequence[str], column: str) -> np.ndarray:
        return self.positions(token_filter(words, column))

    def occurrences(self, words: Sequence[str], column: str, where: str | None,
                    columns: Sequence[str], limit: int) -> pa.Table:
        held = self.ivf()
        keys = [c for c in ("part", "shard", "row") if c not in columns]
        rows = (self.index.table.search().where(both(token_filter(words, column), where))
                .select([*columns, *keys]).limit(limit).to_arrow())
        vectors = held.vectors[held.positions_of_keys(rows)]
        return self._with_vectors(rows.drop_columns(keys), vectors)

    def sentence_texts(self) -> Any:
        return None
