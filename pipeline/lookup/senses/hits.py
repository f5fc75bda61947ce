"""Occurrences found in an index: ``Hit`` (a token in its sentence, with its document's
fields) and what makes two of them the same context."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.lookup.doc_fields import DocumentTable


@dataclass
class Hit:
    rank: int
    similarity: float  # cosine similarity, 1 - LanceDB's cosine distance
    token: str
    doc_id: str
    sent_idx: int
    tok_idx: int
    sentence: str
    start: int
    end: int
    # The document's fields: source, line and its metadata (year, president, ...).
    fields: dict[str, Any] = field(default_factory=dict)

    def highlighted(self, left: str = "[", right: str = "]") -> str:
        s = self.sentence
        if 0 <= self.start <= self.end <= len(s):
            return f"{s[:self.start]}{left}{s[self.start:self.end]}{right}{s[self.end:]}"
        return s

    def snippet(self, width: int = 70, left: str = "[", right: str = "]") -> str:
        """About ``width`` characters of the sentence around the word, the word marked."""
        s = self.sentence
        if not 0 <= self.start <= self.end <= len(s):
            return s[:width]
        side = max(10, (width - (self.end - self.start)) // 2)
        lo, hi = max(0, self.start - side), min(len(s), self.end + side)
        # Cut at spaces, so that no word is shown in part.
        if lo > 0:
            cut = s.find(" ", lo, self.start)
            lo = cut + 1 if cut >= 0 else lo
        if hi < len(s):
            cut = s.rfind(" ", self.end, hi)
            hi = cut if cut >= 0 else hi
        text = f"{s[lo:self.start]}{left}{s[self.start:self.end]}{right}{s[self.end:hi]}"
        return f"{'…' if lo > 0 else ''}{' '.join(text.split())}{'…' if hi < len(s) else ''}"

    def field_text(self, names: Sequence[str] | None = None) -> str:
        """``year=1862 president=Abraham Lincoln``: the named fields (default: all but
        ``source`` and ``line``, which ``doc_id`` already tells), as they are shown."""
        if names is None:
            names = [n for n in self.fields if n not in ("source", "line")]
        shown = [f"{n}={self.fields[n]}" for n in names if self.fields.get(n) is not None]
        return " ".join(shown)

    @property
    def context(self) -> tuple[str, ...]:
        """What makes two occurrences the same context: the sentence text (whitespace
        normalised) and the token's place in it. Without sentence text (a dataset that
        stores none) nothing says two are the same: the occurrence is its own context."""
        text = " ".join(self.sentence.split())
        if not text:
            return "", self.doc_id, str(self.sent_idx), str(self.tok_idx)
        return text, str(self.tok_idx)


def hits_from_table(table: pa.Table, documents: DocumentTable | None = None) -> list[Hit]:
    """Index rows (with ``_distance``) as hits; with ``documents``, each carries its
    document's fields (found by the row's ``part``, ``shard`` and ``doc_id``)."""
    rows = table.to_pylist()
    return [Hit(rank=i + 1, similarity=1.0 - float(r["_distance"]), token=r["token"],
                doc_id=r["doc_id"], sent_idx=r["sent_idx"], tok_idx=r["tok_idx"],
                sentence=r["sentence"], start=r["start"], end=r["end"],
                fields=dict(documents.of(r.get("part", ""), r.get("shard", -1), r["doc_id"]))
                if documents is not None else {})
            for i, r in enumerate(rows)]


def distinct_contexts(hits: Sequence[Hit]) -> list[int]:
    """Positions of the first hit of each context (see ``Hit.context``), in order."""
    seen: set[tuple[str, ...]] = set()
    keep = []
    for i, hit in enumerate(hits):
        if hit.context not in seen:
            seen.add(hit.context)
            keep.append(i)
    return keep
