"""A sense index's sentence texts: one row per sentence in their own table, fetched by key.

Token rows hold only their sentence's key (``doc_id``, ``sent_idx``, the keys of the
dataset's ``sentences`` table) and their character span in it; the text is stored once,
in the index's ``sentences`` table, and read for the few rows a query returns. Indexes
written before this layout (``IndexMeta.layout`` 1) hold the text in every token row,
and are read as they are.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipeline.lookup.doc_fields import quote

if TYPE_CHECKING:
    import pyarrow as pa

SENTENCES_TABLE = "sentences"
SENTENCE_KEY = ("doc_id", "sent_idx")
# Up to this many keys a fetch names their doc_id and sent_idx values; above, it reads the
# sentences of the documents involved, DOC_IDS_PER_QUERY documents a read.
MAX_KEYS = 256
DOC_IDS_PER_QUERY = 500


def sentence_rows(sentences: pa.Table, used: pa.Table, part: str, shard: int) -> pa.Table:
    """The index's sentence rows of one shard file: those of ``sentences`` (the dataset's
    ``doc_id, sent_idx, text``) whose key is among ``used``'s (the indexed tokens')."""
    import numpy as np
    import pyarrow as pa

    keys = used.select(list(SENTENCE_KEY)).group_by(list(SENTENCE_KEY)).aggregate([])
    kept = sentences.select([*SENTENCE_KEY, "text"]).join(keys, keys=list(SENTENCE_KEY),
                                                          join_type="inner")
    n = kept.num_rows
    return pa.table({"doc_id": kept["doc_id"], "sent_idx": kept["sent_idx"],
                     "part": pa.array([part] * n, pa.string()),
                     "shard": pa.array(np.full(n, shard, np.int32)),
                     "text": kept["text"]})


def fetch_sentences(table: Any, keys: pa.Table) -> pa.Table:
    """``doc_id, sent_idx, text`` of the distinct keys in ``keys`` (from the index's
    sentences table ``table``)."""
    import pyarrow as pa

    from pipeline.lookup.index.lance_search import run_async

    distinct = keys.select(list(SENTENCE_KEY)).group_by(list(SENTENCE_KEY)).aggregate([])
    columns = [*SENTENCE_KEY, "text"]
    if distinct.num_rows == 0:
        return pa.table({"doc_id": pa.array([], pa.string()),
                         "sent_idx": pa.array([], pa.int32()), "text": pa.array([], pa.string())})
    async_table = table._table  # one hop on the caller's loop, as the vector search does
    docs = sorted(set(distinct["doc_id"].to_pylist()))
    if distinct.num_rows <= MAX_KEYS:
        # Both key columns' values (a superset of the pairs, cut by the join below): one
        # read through both BTree indexes, faster than a filter naming each pair.
        positions = sorted(set(distinct["sent_idx"].to_pylist()))
        where = [f"doc_id IN ({', '.join(quote(d) for d in docs)}) AND sent_idx IN "
                 f"({', '.join(str(int(i)) for i in positions)})"]
    else:
        where = [f"doc_id IN ({', '.join(quote(d) for d in docs[i:i + DOC_IDS_PER_QUERY])})"
                 for i in range(0, len(docs), DOC_IDS_PER_QUERY)]
    found = [run_async(async_table.query().where(w).select(columns).to_arrow()) for w in where]
    return pa.concat_tables(found).join(distinct, keys=list(SENTENCE_KEY), join_type="inner")


class ShardSentences:
    """The sentence texts a compact index's shards hold (``ivf_shards.SENTENCES_FILE`` in
    each shard's folder), mapped: a search takes its few texts from there without opening
    LanceDB (whose import alone was 2 of a CLI search's 5 seconds)."""

    def __init__(self, paths: Sequence[str]) -> None:
        import pyarrow as pa

        self.tables = [pa.ipc.open_file(pa.memory_map(p)).read_all() for p in paths]

    # As the LanceDB table's: ``hold_sentences`` and ``read_all_texts`` take either.
    def count_rows(self) -> int:
        return sum(t.num_rows for t in self.tables)

    def to_arrow(self) -> pa.Table:
        import pyarrow as pa

        return pa.concat_tables(self.tables)

    @classmethod
    def of(cls, folders: Sequence[str], name: str) -> ShardSentences | None:
        """Those of the shards in ``folders`` (local), or None when a shard lacks its file
        (written before shards held their sentences)."""
        paths = [f"{folder}/{name}" for folder in folders]
        return cls(paths) if all(os.path.exists(p) for p in paths) else None

    def fetch(self, keys: pa.Table) -> pa.Table:
        """``doc_id, sent_idx, text`` of the distinct keys in ``keys``."""
        import pyarrow as pa
        import pyarrow.compute as pc

        distinct = keys.select(list(SENTENCE_KEY)).group_by(list(SENTENCE_KEY)).aggregate([])
        docs = distinct.column("doc_id")
        # A document's sentences are in one shard; only those shards' matching rows are
        # joined (the texts stay in the mapped files).
        found = [t.filter(pc.is_in(t.column("doc_id"), value_set=docs)) for t in self.tables]
        found = [t for t in found if t.num_rows] or found[:1]
        return pa.concat_tables(found).join(distinct, keys=list(SENTENCE_KEY),
                                            join_type="inner")


def with_sentences(table: Any, rows: pa.Table) -> pa.Table:
    """``rows`` (index rows with ``doc_id`` and ``sent_idx``) with a ``sentence`` column
    appended: each row's sentence text from ``table`` (the index's LanceDB sentences table,
    or ``ShardSentences``), "" where none is stored, row order kept."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if rows.num_rows == 0:
        return rows.append_column("sentence", pa.array([], pa.string()))
    texts = table.fetch(rows) if isinstance(table, ShardSentences) \
        else fetch_sentences(table, rows)
    joined = join_in_row_order(rows.select(list(SENTENCE_KEY)), texts, list(SENTENCE_KEY))
    return rows.append_column("sentence", pc.fill_null(joined["text"], ""))


def join_in_row_order(left: pa.Table, right: pa.Table, keys: list[str]) -> pa.Table:
    """``left`` left-outer-joined to ``right`` on ``keys``, in ``left``'s row order (Arrow's
    hash join reorders rows; a row number put on before and sorted by after restores it)."""
    import numpy as np
    import pyarrow as pa

    numbered = left.append_column("_row", pa.array(np.arange(left.num_rows), pa.int64()))
    joined = numbered.join(right, keys=keys, join_type="left outer").sort_by("_row")
    return joined.drop_columns(["_row"])


def read_all_texts(table: Any) -> dict[tuple[str, int], str]:
    """Every sentence text of ``table`` (the index's sentences table, or
    ``ShardSentences``), by key."""
    rows = table.to_arrow()
    return dict(zip(zip(rows["doc_id"].to_pylist(), rows["sent_idx"].to_pylist(), strict=True),
                    rows["text"].to_pylist(), strict=True))


def with_held_sentences(texts: dict[tuple[str, int], str], rows: pa.Table) -> pa.Table:
    """``with_sentences`` from texts held in memory (``read_all_texts``)."""
    import pyarrow as pa

    keys = zip(rows["doc_id"].to_pylist(), rows["sent_idx"].to_pylist(), strict=True)
    return rows.append_column("sentence", pa.array([texts.get(k, "") for k in keys],
                                                   pa.string()))
