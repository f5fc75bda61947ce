"""What every tokenizer returns, and the sentence-boundary rules they share.

A :class:`Token`'s text is always the exact slice ``doc[start:end]`` of the document
(offsets in Unicode code points), whatever the tokenizer, so stored tokens can be traced
back to their source and highlighted there.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Token:
    text: str
    start: int  # code point offsets in the document text: text == doc[start:end]
    end: int


@dataclass(frozen=True)
class Sentence:
    tokens: tuple[Token, ...]

    @property
    def start(self) -> int:
        return self.tokens[0].start

    @property
    def end(self) -> int:
        return self.tokens[-1].end

    @property
    def words(self) -> list[str]:
        return [t.text for t in self.tokens]


# Characters that act as whitespace but are not matched by \s.
_INVISIBLE = {"\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"}


def blank_out_controls(text: str) -> str:
    """Same-length copy where control (Unicode Cc, NUL included) and zero-width/BOM
    characters are spaces: they separate tokens and never appear in one, and offsets into
    the copy are offsets into ``text``."""
    if text.isprintable():
        return text
    return "".join(
        " " if (unicodedata.category(ch) == "Cc" and ch not in "\n\t\r\f\v") or ch in _INVISIBLE
        else ch
        for ch in text
    )


_SENTENCE_END = {".", "!", "?", "...", "…"}
_CLOSERS = set("\"'”’)]}»")
_OPENERS = set("\"'“‘([{«")
_PARAGRAPH_RE = re.compile(r"\n[ \t\r\f\v]*\n")


def _ends_sentence(token: Token) -> bool:
    return token.text in _SENTENCE_END or (
        len(token.text) > 1 and set(token.text) <= {".", "!", "?"})


def _starts_sentence(token: Token) -> bool:
    first = token.text[0]
    return first.isupper() or first.isdigit() or first in _OPENERS


def group_sentences(text: str, tokens: Sequence[Token]) -> list[Sentence]:
    """Group a document's tokens (in order, from any word tokenizer) into sentences.

    A sentence ends after a stop token (``.``, ``!``, ``?``, a run of them, ``...`` or
    ``…``) plus any closing quotes/brackets touching it, when the next token starts with
    an uppercase letter, a digit or an opening quote/bracket, or when the text ends; a
    blank line (paragraph break) always ends a sentence.
    """
    break_points = sorted(m.start() for m in _PARAGRAPH_RE.finditer(text))
    sentences: list[Sentence] = []
    current: list[Token] = []
    bp = 0
    i = 0
    while i < len(tokens):
        token = tokens[i]
        # A paragraph break between the previous token and this one ends the sentence.
        while bp < len(break_points) and break_points[bp] < token.start:
            if current and break_points[bp] >= current[-1].end:
                sentences.append(Sentence(tuple(current)))
                current = []
            bp += 1
        current.append(token)
        i += 1
        if _ends_sentence(token):
            # Closing quotes/brackets touching the stop belong to this sentence; a spaced
            # straight quote opens the next one (`home. "Why?"`).
            while i < len(tokens) and tokens[i].text in _CLOSERS and \
                    tokens[i].start == current[-1].end:
                current.append(tokens[i])
                i += 1
            if i >= len(tokens) or _starts_sentence(tokens[i]):
                sentences.append(Sentence(tuple(current)))
                current = []
    if current:
        sentences.append(Sentence(tuple(current)))
    return sentences
