"""Occurrences found in an index: ``Hit`` (a token in its sentence, with its document's
fields) and what makes two of them the same context."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
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

    def span(self) -> tuple[int, int] | None:
        """Where the word is in ``sentence``: ``start, end`` when they hold the token,
        else the token's place nearest ``start`` (a sentence text normalised after its
        offsets were taken), None when it is not there."""
        s, token = self.sentence, self.token
        if 0 <= self.start <= self.end <= len(s) and \
                (not token or s[self.start:self.end].lower() == token.lower()):
            return self.start, self.end
        lowered, wanted = s.lower(), token.lower()
        places = [m.start() for m in re.finditer(re.escape(wanted), lowered)] if wanted else []
        if not places:
            return None
        at = min(places, key=lambda p: abs(p - self.start))
        return at, at + len(wanted)

    def highlighted(self, left: str = "[", right: str = "]") -> str:
        s, span = self.sentence, self.span()
        if span is None:
            return s
        start, end = span
        return f"{s[:start]}{left}{s[start:end]}{right}{s[end:]}"

    def snippet(self, width: int = 70, left: str = "[", right: str = "]") -> str:
        """About ``width`` characters of the sentence around the word, the word marked."""
        s, span = self.sentence, self.span()
        if span is None:
            return " ".join(s[:width].split())
        start, end = span
        side = max(10, (width - (end - start)) // 2)
        lo, hi = max(0, start - side), min(len(s), end + side)
        # Cut at white space, so that no word is shown in part.
        if lo > 0:
            lo = _after_space(s, lo, start)
        if hi < len(s):
            hi = _before_space(s, end, hi)
        text = f"{s[lo:start]}{left}{s[start:end]}{right}{s[end:hi]}"
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
        """What makes two occurrences the same context: the sentence text (as
        ``senses.contexts.normalised`` compares it) and the token's place in it. Without
        sentence text (a dataset that stores none) nothing says two are the same: the
        occurrence is its own context."""
        from pipeline.lookup.senses.contexts import normalised

        text = normalised(self.sentence)
        if not text:
            return "", self.doc_id, str(self.sent_idx), str(self.tok_idx)
        return text, str(self.tok_idx)


def _after_space(s: str, lo: int, start: int) -> int:
    """The first place after a white space in ``s[lo:start]`` (``lo`` if none)."""
    found = re.search(r"\s", s[lo:start])
    return lo + found.end() if found else lo


def _before_space(s: str, end: int, hi: int) -> int:
    """The last white space in ``s[end:hi]`` (``hi`` if none)."""
    found = [m.start() for m in re.finditer(r"\s", s[end:hi])]
    return end + found[-1] if found else hi


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


def distinct_contexts(hits: Sequence[Hit], groups: Sequence[Any] | None = None) -> list[int]:
    """Positions (ascending) of the hit kept for each context (see ``Hit.context``), in
    each of ``groups`` (one per hit) if given: the rule of ``senses.contexts``."""
    from pipeline.lookup.senses.contexts import first_of_each

    return first_of_each([h.context for h in hits], [h.doc_id for h in hits],
                         [h.sent_idx for h in hits], groups)


def ranked_distinct(hits: Iterable[Hit], k: int) -> list[Hit]:
    """The ranking of every search's hits (CLI, API, server, the server's exact path):
    ``hits`` nearest first, each context once (its nearest use), at most ``k``, ranked
    1..k. ``hits`` may be a generator: it is read only until ``k`` are kept."""
    seen: set[tuple[str, ...]] = set()
    kept: list[Hit] = []
    for hit in hits:
        if len(kept) == k:
            break
        if hit.context in seen:
            continue
        seen.add(hit.context)
        hit.rank = len(kept) + 1
        kept.append(hit)
    return kept
