"""Document fields for sense search and clusters: where a word's occurrences come from.

Every occurrence belongs to a document, and the dataset's ``documents`` table says what
it knows of it: ``source`` (the input file), ``line`` and the extra JSON Lines fields
(``metadata``: ``year``, ``president``, ...). Results carry these fields, and searches and
clusters can be limited by them:

    where=["president=Abraham Lincoln", "year=1861..1865"]             # Python, server
    --where president=Abraham Lincoln --where year=1861..1865          # CLI
    where={"president": "Abraham Lincoln", "year": {">=": 1861, "<=": 1865}}  # a mapping

A field the index stores (``doc_id``, ``source``, and the metadata fields whose values
were all numbers or all text when the index was created, as ``meta_<name>`` columns) is
filtered by LanceDB before the nearest-neighbour search (a prefilter); any other field is
matched on the documents table and becomes a ``doc_id IN (...)`` prefilter.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError, SettingError

if TYPE_CHECKING:
    import pyarrow as pa

    from schemas.dataset import Dataset

# Always in an index row (fields of the row itself, not of the metadata).
INDEX_FIELDS = ("doc_id", "source")
# Shown with every result; ``line`` is read from the documents table.
DOCUMENT_COLUMNS = ("source", "line")
FIELD_COLUMN_PREFIX = "meta_"
# A metadata field becomes an index column only with a plain name, and only this many:
# each costs a column in every token row.
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
MAX_INDEXED_FIELDS = 16
KINDS = ("int", "float", "string")
OPERATORS = ("=", "!=", ">=", "<=", ">", "<", "~", "in")
WHERE_SYNTAX = ("FIELD=VALUE, FIELD!=VALUE, FIELD>=N (also <=, >, <), FIELD=LO..HI "
                "(a range, ends included), FIELD=A|B (any of), FIELD~TEXT (contains, any case)")


def quote(value: str) -> str:
    """A Lance SQL string literal. Lance filters take no bind parameters, so user text is
    quoted here (quotes doubled, control characters refused) and nowhere else."""
    if any(ord(c) < 32 for c in value):
        raise ElmoUserError("search words and filter values cannot contain control characters")
    return "'" + value.replace("'", "''") + "'"


def value_kind(value: Any) -> str | None:
    """``int``, ``float`` or ``string`` for a scalar JSON value; None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float" if math.isfinite(value) else None
    return "string" if isinstance(value, str) else None


def field_kinds(documents: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Each field's kind over ``documents``: ``int`` if every value is an integer, ``float``
    if every value is a number, ``string`` if every value is text; a field mixing these
    (or holding lists, objects, booleans) has no kind and is left out. Nulls are ignored."""
    kinds: dict[str, str | None] = {}
    for fields in documents:
        for name, value in fields.items():
            if value is None:
                continue
            kind, seen = value_kind(value), kinds.get(name, "")
            if seen == "":
                kinds[name] = kind
            elif seen != kind:
                numbers = {seen, kind} == {"int", "float"}
                kinds[name] = "float" if numbers else None
    return {name: kind for name, kind in sorted(kinds.items()) if kind}


def indexable_fields(kinds: Mapping[str, str]) -> dict[str, str]:
    """The metadata fields an index stores as columns (plain names, at most
    ``MAX_INDEXED_FIELDS``, never one that shadows a field of the row)."""
    names = [n for n in kinds if FIELD_NAME.match(n) and n not in (*INDEX_FIELDS, "line")]
    return {name: kinds[name] for name in names[:MAX_INDEXED_FIELDS]}


def field_column(name: str) -> str:
    """The index column holding field ``name``."""
    return name if name in INDEX_FIELDS else FIELD_COLUMN_PREFIX + name


def parse_metadata(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def read_documents(ds: Dataset, path: str) -> tuple[list[str], list[dict[str, Any]]]:
    """``(doc_ids, fields)`` of one documents file: ``source``, ``line`` and the metadata."""
    import pyarrow.parquet as pq

    with ds.fs.open(path, "rb") as handle:
        # One file: ParquetFile, not read_table's dataset discovery (a tenth of a file's read).
        table = pq.ParquetFile(handle).read(columns=["doc_id", "source", "line", "metadata"])
    rows = table.to_pydict()
    # The table's own source and line win over metadata fields of the same name.
    fields = [{**parse_metadata(meta), "source": source, "line": line}
              for source, line, meta in zip(rows["source"], rows["line"], rows["metadata"],
                                            strict=True)]
    return rows["doc_id"], fields


def index_field_arrays(doc_ids: pa.Array, documents: tuple[list[str], list[dict[str, Any]]],
                       kinds: Mapping[str, str]) -> dict[str, pa.Array]:
    """The index's document columns for token rows of ``doc_ids``: ``source`` and one
    ``meta_<name>`` column per indexed field (null where a document lacks the field or
    its value is not of the field's kind)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids, fields = documents
    position = pc.index_in(doc_ids, value_set=pa.array(ids, pa.string()))
    types = {"int": pa.int64(), "float": pa.float64(), "string": pa.string()}
    columns = {"source": pa.array([f["source"] for f in fields], pa.string()).take(position)}
    for name, kind in kinds.items():
        values = [_as_kind(f.get(name), kind) for f in fields]
        columns[field_column(name)] = pa.array(values, types[kind]).take(position)
    return columns


def _as_kind(value: Any, kind: str) -> Any:
    found = value_kind(value)
    if found == kind or (kind == "float" and found == "int"):
        return value
    return None


# --------------------------------------------------------------------------- filters


@dataclass(frozen=True)
class FieldFilter:
    """One condition on a document field: ``year >= 1900``, ``president = 'X'``,
    ``party in (a, b)``, ``president ~ lincoln`` (contains, any case)."""

    field: str
    op: str
    value: Any

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ElmoUserError(f"filter operator must be one of {' '.join(OPERATORS)}, "
                                f"not {self.op!r}")

    def describe(self) -> str:
        if self.op == "in":
            return f"{self.field}={'|'.join(str(v) for v in self.value)}"
        return f"{self.field}{self.op}{self.value}"

    def typed(self, kind: str) -> FieldFilter:
        """This filter with its value(s) as ``kind`` (numbers for a numeric field)."""
        if kind == "string" or self.op == "~":
            convert: Any = str
        else:
            def convert(v: Any) -> float | int:
                try:
                    number = float(v)
                except (TypeError, ValueError):
                    raise SettingError("where", lambda name: (
                        f"{self.field} holds numbers: {self.describe()} needs a number "
                        f"(e.g. {name('where')} {self.field}>=1900)")) from None
                return int(number) if number.is_integer() else number
        value = [convert(v) for v in self.value] if self.op == "in" else convert(self.value)
        return FieldFilter(self.field, self.op, value)

    def matches(self, value: Any) -> bool:
        """Whether a document whose field holds ``value`` passes (filter already typed)."""
        if value is None:
            return False
        if self.op == "~":
            return str(self.value).lower() in str(value).lower()
        if isinstance(self.value, str) or (self.op == "in" and self.value
                                           and isinstance(self.value[0], str)):
            value = str(value)
        elif value_kind(value) not in ("int", "float"):
            return False
        if self.op == "in":
            return value in self.value
        return {"=": value == self.value, "!=": value != self.value,
                ">=": value >= self.value, "<=": value <= self.value,
                ">": value > self.value, "<": value < self.value}[self.op]

    def lance(self, column: str) -> str:
        """The filter as a Lance SQL predicate on ``column`` (filter already typed)."""
        def literal(v: Any) -> str:
            return quote(v) if isinstance(v, str) else repr(v)

        if self.op == "in":
            return f"{column} IN ({', '.join(literal(v) for v in self.value)})"
        if self.op == "~":
            pattern = str(self.value).lower().replace("\\", "\\\\").replace("%", "\\%") \
                .replace("_", "\\_")
            return f"lower({column}) LIKE {quote('%' + pattern + '%')}"
        return f"{column} {'<>' if self.op == '!=' else self.op} {literal(self.value)}"


    def expression(self) -> Any:
        """The filter as a pyarrow compute expression on the column of its name (filter
        already typed): what ``open_dataset(...).to_table(filter=...)`` applies."""
        import pyarrow.compute as pc

        column = pc.field(self.field)
        if self.op == "in":
            return column.isin(self.value)
        if self.op == "~":
            return pc.match_substring(column, str(self.value), ignore_case=True)
        return {"=": column == self.value, "!=": column != self.value,
                ">=": column >= self.value, "<=": column <= self.value,
                ">": column > self.value, "<": column < self.value}[self.op]


WHERE = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*(!=|>=|<=|=|>|<|~)\s*(.*)\Z", re.S)


def parse_where(text: str) -> list[FieldFilter]:
    """The CLI's ``--where`` conditions (``WHERE_SYNTAX``); a range gives two filters."""
    found = WHERE.match(text)
    if not found or not found.group(3).strip():
        raise SettingError("where", lambda name: f"{name('where')} {text!r}: write {WHERE_SYNTAX}")
    name, op, value = found.group(1), found.group(2), found.group(3).strip()
    if op == "=" and ".." in value:
        low, _, high = value.partition("..")
        if not low.strip() and not high.strip():
            raise SettingError("where", lambda flag: (
                f"{flag('where')} {text!r}: a range needs an end, e.g. {name}=1900..1950"))
        return ([FieldFilter(name, ">=", low.strip())] if low.strip() else []) + \
            ([FieldFilter(name, "<=", high.strip())] if high.strip() else [])
    if op == "=" and "|" in value:
        return [FieldFilter(name, "in", [v.strip() for v in value.split("|")])]
    return [FieldFilter(name, op, value)]


# One filter language, however it arrives: condition text as the CLI's ``--where`` writes
# it (``"year=1900..1950"``, one string or several), a mapping, or ``FieldFilter``s.
Filters = str | Mapping[str, Any] | Sequence[FieldFilter | str] | None


def as_filters(filters: Filters) -> list[FieldFilter]:
    """Filters from condition text (``parse_where``: ``"year=1900..1950"``,
    ``["party=A|B", "year>=1900"]``), ``FieldFilter``s, or a mapping of field to a value
    (equal), a list of values (any of, whatever their number or kind) or operators to
    values (``{"year": {">=": 1900, "<=": 1950}}``: a range, ends included)."""
    if not filters:
        return []
    if isinstance(filters, str):
        return parse_where(filters)
    if not isinstance(filters, Mapping):
        return [c for f in filters
                for c in (parse_where(f) if isinstance(f, str) else [f])]
    out: list[FieldFilter] = []
    for name, value in filters.items():
        if isinstance(value, Mapping):
            out += [FieldFilter(name, op, v) for op, v in value.items()]
        elif isinstance(value, list | tuple):
            out.append(FieldFilter(name, "in", list(value)))
        else:
            out.append(FieldFilter(name, "=", value))
    return out


# --------------------------------------------------------------------------- documents


class DocumentTable:
    """The live documents' fields, by ``(part, shard, doc_id)``: what results show, and
    what filters on fields the index does not store are matched against. A shard's
    documents file is read when a result from it is first shown; all of them when a filter
    needs the field kinds or a join (then kept)."""

    def __init__(self, ds: Dataset | None, unreadable: str = "") -> None:
        """``ds`` None: the dataset cannot be read (``unreadable`` says why); results then
        carry no fields and only the index's own fields can be filtered."""
        self.ds, self.unreadable = ds, unreadable
        self.files: dict[tuple[str, int], str] = {}
        for key, path in ds.shard_files("documents") if ds is not None else []:
            part, shard_text, _ = key.split("/")
            self.files[(part, int(shard_text.split("=", 1)[1]))] = path
        self.shards: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
        self._kinds: dict[str, str] | None = None

    def _shard(self, part: str, shard: int) -> dict[str, dict[str, Any]]:
        if (part, shard) not in self.shards:
            path = self.files.get((part, shard))
            ids, fields = read_documents(self.ds, path) if path and self.ds else ([], [])
            self.shards[(part, shard)] = dict(zip(ids, fields, strict=True))
        return self.shards[(part, shard)]

    def of(self, part: str, shard: int, doc_id: str) -> dict[str, Any]:
        return self._shard(part, shard).get(doc_id, {})

    def rows(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(doc_id, fields)`` of every document."""
        for part, shard in self.files:
            yield from self._shard(part, shard).items()

    @property
    def kinds(self) -> dict[str, str]:
        """Each field's kind (``field_kinds``); a field whose values mix kinds is text."""
        if self._kinds is None:
            seen = {name for _, row in self.rows() for name in row}
            self._kinds = {**dict.fromkeys(sorted(seen), "string"),
                           **field_kinds(row for _, row in self.rows())}
        return self._kinds

    def names(self) -> list[str]:
        return ["doc_id", *DOCUMENT_COLUMNS,
                *sorted(n for n in self.kinds if n not in DOCUMENT_COLUMNS)]

    def check(self, name: str) -> str:
        """The kind of field ``name``; an unknown name is a user error listing the known."""
        if name == "doc_id":
            return "string"
        if self.ds is None:
            raise ElmoUserError(f"cannot filter on {name!r}: {self.unreadable}; filter on "
                                "the fields the index holds (`elmo index info` lists them)")
        if name not in self.kinds:
            raise ElmoUserError(f"no document has a field {name!r}; the fields are "
                                f"{', '.join(self.names())}")
        return self.kinds[name]

    def doc_ids_where(self, filters: Sequence[FieldFilter]) -> list[str]:
        """The doc_ids of the documents that pass every (typed) filter."""
        keep = {doc_id for doc_id, row in self.rows()
                if all(f.matches(doc_id if f.field == "doc_id" else row.get(f.field))
                       for f in filters)}
        return sorted(keep)


def fields_where(filters: Sequence[FieldFilter], indexed: Mapping[str, str],
                 documents: Callable[[], DocumentTable], max_join_ids: int,
                 rebuild: str) -> str | None:
    """A Lance predicate for document-field ``filters`` on an index whose rows hold the
    fields ``indexed`` (name -> kind): on its own columns where it has the field, else
    ``doc_id IN`` the documents (``documents()``, read only then) that pass; more than
    ``max_join_ids`` of those is an error naming the build that stores the fields
    (``rebuild``)."""
    clauses, joined = [], []
    for condition in filters:
        kind = indexed.get(condition.field) or documents().check(condition.field)
        typed = condition.typed(kind)
        # "contains" reads a number as its digits: that comparison runs on the join.
        if condition.field in indexed and (condition.op != "~" or kind == "string"):
            clauses.append(typed.lance(field_column(condition.field)))
        else:
            joined.append(typed)
    if joined:
        ids = documents().doc_ids_where(joined)
        if len(ids) > max_join_ids:
            raise ElmoUserError(
                f"{len(ids)} documents pass {' '.join(f.describe() for f in joined)}, too "
                f"many to filter on a join; rebuild the index ({rebuild}) so that it holds "
                "these fields, or narrow the filter")
        clauses.append(f"doc_id IN ({', '.join(quote(i) for i in ids)})" if ids else "false")
    return " AND ".join(f"({c})" for c in clauses) if clauses else None
