"""Sentence-boundary scoring: how well a splitter's sentence ends match a gold file's.

A boundary is the offset where a sentence ends inside a paragraph (after its last visible
character); the paragraph's own end is not counted, since every splitter gets it right.
The gold format (``tests/fixtures/sentences/gold.txt``): one sentence a line, paragraphs
separated by blank lines, ``#`` lines are comments; a paragraph's text is its sentences
joined by single spaces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GoldParagraph:
    text: str
    ends: frozenset[int]  # the gold boundaries, paragraph end excluded


def read_sentence_gold(path: Path) -> list[GoldParagraph]:
    paragraphs: list[GoldParagraph] = []
    sentences: list[str] = []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if line.startswith("#"):
            continue
        if line.strip():
            sentences.append(line.strip())
            continue
        if sentences:
            text = " ".join(sentences)
            ends, at = set(), 0
            for sentence in sentences[:-1]:
                at += len(sentence)
                ends.add(at)
                at += 1
            paragraphs.append(GoldParagraph(text, frozenset(ends)))
            sentences = []
    return paragraphs


def ends_of_spans(text: str, spans: Iterable[tuple[int, int]]) -> frozenset[int]:
    """Boundaries of ``(start, end)`` sentence spans, trailing whitespace trimmed."""
    ends = set()
    for start, end in spans:
        while end > start and text[end - 1].isspace():
            end -= 1
        ends.add(end)
    ends.discard(len(text.rstrip()))
    return frozenset(ends)


def ends_of_strings(text: str, sentences: Iterable[str]) -> frozenset[int]:
    """Boundaries of sentences given as strings, found in ``text`` left to right (for
    splitters that return no offsets)."""
    spans, at = [], 0
    for sentence in sentences:
        piece = sentence.strip()
        if not piece:
            continue
        start = text.find(piece, at)
        if start < 0:  # the splitter rewrote the text: this sentence's end is unknown
            continue
        spans.append((start, start + len(piece)))
        at = start + len(piece)
    return ends_of_spans(text, spans)


@dataclass(frozen=True)
class BoundaryScore:
    true_positives: int
    predicted: int
    gold: int

    @property
    def precision(self) -> float:
        return self.true_positives / self.predicted if self.predicted else 1.0

    @property
    def recall(self) -> float:
        return self.true_positives / self.gold if self.gold else 1.0

    @property
    def f1(self) -> float:
        total = self.precision + self.recall
        return 2 * self.precision * self.recall / total if total else 0.0


def score_boundaries(gold: list[GoldParagraph], predicted: list[frozenset[int]]) -> BoundaryScore:
    hits = sum(len(g.ends & p) for g, p in zip(gold, predicted, strict=True))
    return BoundaryScore(hits, sum(len(p) for p in predicted), sum(len(g.ends) for g in gold))
