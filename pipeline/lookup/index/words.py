"""Words in a sense index: their stems and filters, and which words it holds (all, a word
list, or a frequency range).

    elmo index build DATA --out IX --words play,bank        # or --words words.txt
    elmo index build DATA --out IX --min-count 5 --max-count 50000

Words match in any case (``Play`` and ``play`` are one word). The selection is resolved
when the index is created, against the dataset's counts then (a frequency range becomes
the list of lowercase words in range), and that list is kept in the index
(``_selected_words.parquet``): later builds and the jobs' refresh add the rows of those
words only, so that an index never holds part of a word's occurrences. ``--rebuild``
resolves the range again.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.doc_fields import quote

if TYPE_CHECKING:
    import pyarrow as pa

    from schemas.dataset import Dataset

SELECTED_WORDS = "_selected_words.parquet"
MAX_LISTED_WORDS = 8  # words named in a description; the rest are counted


@functools.cache
def _stemmer() -> Any:
    import snowballstemmer

    return snowballstemmer.stemmer("english")


# The stemmer is pure Python: a build meets the same words in every chunk, so each is
# stemmed once.
@functools.lru_cache(maxsize=1 << 18)
def _stem(word: str) -> str:
    return _stemmer().stemWord(word)


def stem_words(words: Sequence[str]) -> list[str]:
    """Snowball English stems of ``words``, lowercased first (Plays, played -> play)."""
    return [_stem(w.lower()) for w in words]


def column_words(words: Sequence[str], column: str) -> Sequence[str]:
    """``words`` as ``column`` stores them: ``token_lower`` lowercases the words,
    ``token_stem`` stems them, ``token`` takes them as they are."""
    if column == "token_lower":
        return [w.lower() for w in words]
    if column == "token_stem":
        return stem_words(words)
    return words


def token_filter(words: Sequence[str], column: str = "token_lower") -> str:
    """``column = 'w'`` / ``column IN (...)``, the words as ``column`` stores them
    (``column_words``)."""
    words = column_words(words, column)
    if len(words) == 1:
        return f"{column} = {quote(words[0])}"
    return f"{column} IN ({', '.join(quote(w) for w in words)})"


@dataclass
class WordSelection:
    """``words`` (lowercase; None: every word) and/or a count range (both ends included)
    of each lowercase word's occurrences in the dataset."""

    words: list[str] | None = None
    min_count: int | None = None
    max_count: int | None = None

    def __post_init__(self) -> None:
        for name in ("min_count", "max_count"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SettingError(name, lambda named, n=name: f"{named(n)} must be at least 1")
        if self.min_count and self.max_count and self.min_count > self.max_count:
            raise SettingError("min_count", lambda named: (
                f"{named('min_count')} is above {named('max_count')}: no word would be indexed"))
        if self.words is not None:
            self.words = sorted({w.lower() for w in self.words if w.strip()})
            if not self.words:
                raise ElmoUserError("--words names no word; give w1,w2 or a file of words")

    @property
    def everything(self) -> bool:
        return self.words is None and self.min_count is None and self.max_count is None

    def describe(self) -> str:
        shown = []
        if self.words is not None:
            listed = ", ".join(self.words[:MAX_LISTED_WORDS])
            more = len(self.words) - MAX_LISTED_WORDS
            shown.append(f"the words {listed}" + (f" and {more} more" if more > 0 else ""))
        if self.min_count is not None or self.max_count is not None:
            low, high = self.min_count or 1, self.max_count
            shown.append(f"words seen {low}..{high if high else ''} times")
        return " among ".join(shown) if shown else "every word"

    def to_json(self) -> dict[str, Any] | None:
        return None if self.everything else asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> WordSelection:
        return cls(**data) if data else cls()


def parse_words(text: str | None) -> list[str] | None:
    """``--words``: a file of words (one a line, or separated by spaces or commas) if the
    path exists, else ``w1,w2``."""
    if text is None:
        return None
    path = Path(text)
    raw = path.read_text(encoding="utf-8") if path.is_file() else text
    return [w for w in raw.replace(",", " ").split() if w]


def dataset_word_counts(ds: Dataset) -> pa.Table:
    """``token_lower, rows``: each lowercase word's tokens in the dataset's live view."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    total: dict[str, int] = {}
    for _, path in ds.shard_files("tokens"):
        with ds.fs.open(path, "rb") as handle:
            tokens = pq.read_table(handle, columns=["token"]).column("token")
        counted = pc.value_counts(pc.utf8_lower(tokens).combine_chunks())
        for word, n in zip(counted.field("values").to_pylist(),
                           counted.field("counts").to_pylist(), strict=True):
            total[word] = total.get(word, 0) + n
    return pa.table({"token_lower": pa.array(list(total), pa.string()),
                     "rows": pa.array(list(total.values()), pa.int64())})


def resolve(selection: WordSelection, ds: Dataset) -> list[str] | None:
    """The lowercase words ``selection`` keeps in ``ds`` now (None: every word)."""
    if selection.everything:
        return None
    if selection.min_count is None and selection.max_count is None:
        return list(selection.words or [])
    import pyarrow.compute as pc

    counts = dataset_word_counts(ds)
    keep = pc.greater_equal(counts["rows"], selection.min_count or 1)
    if selection.max_count is not None:
        keep = pc.and_(keep, pc.less_equal(counts["rows"], selection.max_count))
    words = counts["token_lower"].filter(keep).to_pylist()
    if selection.words is not None:
        listed = set(selection.words)
        words = [w for w in words if w in listed]
    if not words:
        raise ElmoUserError(f"no word of the dataset is {selection.describe()}; widen "
                            "--min-count / --max-count")
    return sorted(words)


def write_selected(fs: Any, root: str, words: list[str], name: str = SELECTED_WORDS) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from schemas.dataset import write_bytes_atomic

    body = io.BytesIO()
    pq.write_table(pa.table({"token_lower": pa.array(words, pa.string())}), body,
                   compression="zstd")
    write_bytes_atomic(fs, f"{root}/{name}", body.getvalue())


def read_selected(fs: Any, root: str, name: str | None = None) -> pa.Array:
    """The selected words an index's build wrote to ``name`` (None: the older fixed name)."""
    import pyarrow.parquet as pq

    name = name or SELECTED_WORDS
    try:
        with fs.open(f"{root}/{name}", "rb") as handle:
            return pq.read_table(handle).column("token_lower").combine_chunks()
    except FileNotFoundError:
        raise ElmoUserError(f"{root} selects words but lacks {name}; rebuild it "
                            "with --rebuild") from None


def keep_mask(lower: pa.Array, selected: pa.Array | None) -> pa.Array | None:
    """Which of the lowercase tokens ``lower`` the index holds (None: all)."""
    import pyarrow.compute as pc

    return None if selected is None else pc.is_in(lower, value_set=selected)


class WordCounts:
    """The counts file an index build writes (``meta.WORD_COUNTS``: rows per lowercase
    token, with its stem), read on first use."""

    def __init__(self, fs: Any, path: str, current: bool) -> None:
        """``current``: the file was written for the index's rows as they are."""
        self.fs, self.path, self.current = fs, path, current
        self._table: pa.Table | None = None
        self._read = False

    def table(self) -> pa.Table | None:
        """The counts (None: the index predates the file, or it is stale)."""
        if not self._read:
            self._read = True
            if self.current:
                import pyarrow.parquet as pq

                try:
                    with self.fs.open(self.path, "rb") as handle:
                        self._table = pq.read_table(handle)
                except FileNotFoundError:
                    self._table = None
        return self._table

    def rows(self, words: Sequence[str], column: str) -> int | None:
        """Rows whose ``column`` is one of ``column_words(words, column)``; None when the
        counts cannot say (no current file, or none for ``column``)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        counts = self.table()
        if counts is None or column not in counts.column_names:
            return None
        wanted = pa.array(column_words(words, column), pa.string())
        hits = pc.is_in(counts.column(column), value_set=wanted)
        return int(pc.sum(counts.column("rows").filter(hits)).as_py() or 0)
