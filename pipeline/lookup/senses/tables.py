"""A clustering as data: senses counted by a document field, and occurrence -> sense rows.

    result = cluster_senses(ix, ["union"])
    table = sense_breakdown(ix, ["union"], by="year", bin=10)   # clusters, then counts
    table = breakdown_of(result, by="president")                # counts of a clustering
    write_assignments(result, "union.parquet")

The counts are of distinct contexts (``senses.contexts``): of the word's occurrences
(``ClusterResult.all_occurrences``), a sentence repeated in several documents of a group
counts once there, as in ``elmo senses change``'s ranking; the assignments table lists
every occurrence. They return data and print
nothing (the CLI and the HTTP server format it).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.doc_fields import Filters, value_kind
from pipeline.lookup.index.sense_index import SenseIndex
from pipeline.lookup.senses.clusters import ClusterResult, cluster_senses
from pipeline.lookup.senses.hits import Hit, distinct_contexts
from pipeline.lookup.senses.maps import check_writable
from schemas.files import write_whole

NONE_LABEL = "(none)"  # the group of occurrences whose document lacks the field
# Columns of an assignments file before the document fields.
ASSIGNMENT_COLUMNS = ("doc_id", "sent_idx", "tok_idx", "token", "cluster", "sense",
                      "similarity", "sentence", "start", "end")


@dataclass
class BreakdownRow:
    value: str  # the field's value or bin, as shown: "1900-1909", "Abraham Lincoln"
    start: Any  # the value or the bin's first value (None: no value); what rows sort by
    counts: list[int]  # distinct contexts per sense, in the result's cluster order
    total: int

    def shares(self) -> list[float]:
        return [c / self.total if self.total else 0.0 for c in self.counts]


@dataclass
class SenseBreakdown:
    words: list[str]
    by: str
    bin: float | None
    senses: list[str]  # each cluster's name (SenseCluster.name), cluster order
    rows: list[BreakdownRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (for the HTTP server)."""
        return {"words": self.words, "by": self.by, "bin": self.bin, "senses": self.senses,
                "rows": [{"value": r.value, "start": r.start, "counts": r.counts,
                          "total": r.total} for r in self.rows],
                "counted": "distinct contexts"}


def field_value(hit: Hit, by: str) -> Any:
    return hit.doc_id if by == "doc_id" else hit.fields.get(by)


def bin_of(value: Any, width: float | None, last: Any = None) -> tuple[Any, str]:
    """``(start, label)`` of ``value``'s group: its bin of ``width`` for a number
    (1903, 10 -> 1900, "1900-1909"), else the value itself. ``last``: the data's largest
    value, which ends the label of the bin holding it (2026, 5 -> "2025-2026", not
    "2025-2029": no data says anything of the years after it)."""
    if value is None:
        return None, NONE_LABEL
    if width is None or value_kind(value) not in ("int", "float"):
        return value, str(value)
    start = math.floor(value / width) * width
    if float(width).is_integer() and float(start).is_integer():
        start, end = int(start), int(start + width - 1)
        if last is not None and start <= last < end and float(last).is_integer():
            end = int(last)
        return start, str(start) if end == start else f"{start}-{end}"
    return start, f"{start:g} to <{start + width:g}"


def last_number(values: Iterable[Any]) -> Any:
    """The largest number among ``values`` (``bin_of``'s ``last``), None without one."""
    return max((v for v in values if value_kind(v) in ("int", "float")), default=None)


def breakdown_of(result: ClusterResult, by: str, bin: float | None = None) -> SenseBreakdown:
    """Occurrences of each sense of ``result`` per value of document field ``by``
    (per bin of width ``bin`` for a numeric field: ``bin=10`` on ``year``, decades)."""
    if bin is not None and not bin > 0:
        raise SettingError("bin", lambda name: (
            f"{name('bin')} must be a positive number, not {bin}"))
    every = result.all_occurrences or result.occurrences
    counted = distinct_contexts(every, [bin_of(field_value(h, by), bin)[1] for h in every])
    hits = [every[i] for i in counted]
    labels = (result.all_labels if len(result.all_labels) else result.labels)[counted]
    values = [field_value(h, by) for h in hits]
    if all(v is None for v in values):
        names = sorted({n for h in hits for n in h.fields} | {"doc_id"})
        raise ElmoUserError(f"no occurrence's document has a field {by!r}; the fields are "
                            f"{', '.join(names)}")
    if bin is not None and any(value_kind(v) == "string" for v in values):
        raise SettingError("bin", lambda name: (
            f"{by} holds text, which has no bins; leave out {name('bin')}"))
    groups: dict[str, tuple[Any, Counter[int]]] = {}
    # The last bin ends at the latest of all the uses (as the ranking's), not of the
    # distinct contexts counted.
    last = last_number(field_value(h, by) for h in every)
    for value, label in zip(values, labels.tolist(), strict=True):
        start, text = bin_of(value, bin, last)
        groups.setdefault(text, (start, Counter()))[1][label] += 1
    k = len(result.clusters)

    def order(item: tuple[str, tuple[Any, Counter[int]]]) -> tuple[int, Any]:
        start = item[1][0]
        if start is None:
            return 2, ""
        return (0, start) if value_kind(start) in ("int", "float") else (1, str(start))

    rows = [BreakdownRow(text, start, [counts[c] for c in range(k)], sum(counts.values()))
            for text, (start, counts) in sorted(groups.items(), key=order)]
    return SenseBreakdown(list(result.words), by, bin, [c.name() for c in result.clusters],
                          rows)


def sense_breakdown(index: str | SenseIndex, words: str | Sequence[str], by: str,
                    bin: float | None = None, *, k: int | str = "auto",
                    filters: Filters = None, centre: str = "case", seed: int = 0
                    ) -> SenseBreakdown:
    """Cluster ``words`` (``cluster_senses``) and count each sense per value of document
    field ``by``: ``sense_breakdown(ix, "union", by="year", bin=10)``, per decade."""
    words = [words] if isinstance(words, str) else list(words)
    result = cluster_senses(index, words, k=k, filters=filters, centre=centre, seed=seed,
                            examples=1)
    return breakdown_of(result, by, bin)


def assignments_table(result: ClusterResult) -> Any:
    """One row per occurrence: where it is, its cluster (1-based, as printed: ``sense 1``)
    and that sense's name, its cosine to the cluster's centre (clustered contexts only),
    then its document's fields (``source``, ``line``, the metadata; a field named like a
    column above gets a ``doc_`` prefix)."""
    import pyarrow as pa

    hits = result.all_occurrences or result.occurrences
    labels = (result.all_labels if len(result.all_labels) else result.labels).tolist()
    names = [c.name() for c in result.clusters]
    centre_sim = {id(h): h.similarity for h in result.occurrences}
    columns: dict[str, Any] = {
        "doc_id": pa.array([h.doc_id for h in hits], pa.string()),
        "sent_idx": pa.array([h.sent_idx for h in hits], pa.int32()),
        "tok_idx": pa.array([h.tok_idx for h in hits], pa.int32()),
        "token": pa.array([h.token for h in hits], pa.string()),
        "cluster": pa.array([label + 1 for label in labels], pa.int32()),
        "sense": pa.array([names[label] for label in labels], pa.string()),
        "similarity": pa.array([centre_sim.get(id(h)) for h in hits], pa.float32()),
        "sentence": pa.array([h.sentence for h in hits], pa.string()),
        "start": pa.array([h.start for h in hits], pa.int32()),
        "end": pa.array([h.end for h in hits], pa.int32()),
    }
    seen = dict.fromkeys(n for h in hits for n in h.fields)
    fields = [n for n in ("source", "line") if n in seen] + \
        [n for n in seen if n not in ("source", "line")]
    for name in fields:
        values = [h.fields.get(name) for h in hits]
        try:
            array = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed kinds: kept as JSON-ish text
            array = pa.array([None if v is None else str(v) for v in values], pa.string())
        columns[f"doc_{name}" if name in columns else name] = array
    return pa.table(columns)


def write_assignments(result: ClusterResult, path: str | Path) -> Path:
    """``assignments_table`` as a Parquet file (written whole, then moved into place)."""
    import pyarrow.parquet as pq

    table = assignments_table(result)
    return write_whole(check_writable(path),
                       lambda tmp: pq.write_table(table, tmp, compression="zstd"))
