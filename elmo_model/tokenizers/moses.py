"""``moses``: the Moses tokenizer (sacremoses, English, unescaped), with exact offsets.

The original ELMo weights (bilm-tf, AllenNLP) were trained on the 1B Word Benchmark,
tokenized with Moses and not escaped (AllenNLP issue #1933): ``don't`` -> ``don 't``,
``It's`` -> ``It 's``, ``U.S.A.`` and ``Mr.`` stay whole, ``hello-world`` stays whole
(no aggressive dash splitting), quotes stay ``"``. So this is the tokenizer for any
weights that declare none.

Moses, like ``tokenizer.perl``, works one line at a time and returns strings, not
offsets; each line is tokenized on its own and the tokens are found again in the line,
left to right. Moses very rarely rewrites characters (sacremoses turns a literal
``DOTMULTI`` into ``.``); a token that is not found verbatim is replaced by the source
text between its aligned neighbours, cut at whitespace, so a token's text is always the
source slice ``doc[start:end]`` and no visible character of the source is lost. Control
and zero-width characters are spaces to Moses (by itself it would delete them and glue
the words around them together).

Moses has no sentence splitter: sentences follow the shared rules of
:func:`elmo_model.tokenizers.text.group_sentences`. The version is this module's rules
plus the sacremoses release, since a new release may tokenize differently.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from elmo_model.tokenizers.text import Sentence, Token, blank_out_controls, group_sentences

if TYPE_CHECKING:
    from sacremoses import MosesTokenizer

NAME = "moses"
RULES_VERSION = "1"
_LINE_RE = re.compile(r"[^\r\n]+")
_CHUNK_RE = re.compile(r"\S+")


def full_version() -> str:
    from importlib.metadata import version  # slow to import: not on every elmo start-up

    return f"{RULES_VERSION}+sacremoses-{version('sacremoses')}"


@functools.cache
def _moses() -> MosesTokenizer:
    from sacremoses import MosesTokenizer  # imported on first use: it loads word lists

    class _FasterPredicates(MosesTokenizer):  # type: ignore[misc]
        """sacremoses rebuilds a set of every lowercase (or alphabetic) code point on each
        ``islower``/``isanyalpha`` call, a quarter of its time on English prose. The same
        tests against sets built once; ``tests/model/test_tokenizers.py`` checks the tokens
        against plain sacremoses."""

        _lower = frozenset(MosesTokenizer.IsLower)
        _alpha = frozenset(MosesTokenizer.IsAlpha)

        def islower(self, text: str) -> bool:
            return self._lower.issuperset(text)

        def isanyalpha(self, text: str) -> bool:
            return not self._alpha.isdisjoint(text)

    return _FasterPredicates(lang="en")


def _source_chunks(text: str, scan: str, start: int, end: int) -> list[Token]:
    """The source between two aligned tokens, cut at whitespace (Moses rewrote it)."""
    return [Token(text[m.start():m.end()], m.start(), m.end())
            for m in _CHUNK_RE.finditer(scan, start, end)]


def _align(text: str, scan: str, pieces: list[str], start: int, end: int) -> list[Token]:
    """Find Moses' ``pieces`` of the line ``scan[start:end]`` in order."""
    tokens: list[Token] = []
    pos = start
    rewritten = False  # a piece since the last aligned token was not found verbatim
    for piece in pieces:
        if not piece:
            continue
        at = scan.find(piece, pos, end)
        # verbatim: only whitespace before it; after a rewritten piece it may sit further on
        if at < 0 or not (at == pos or rewritten or scan[pos:at].isspace()):
            rewritten = True
            continue
        if rewritten:
            tokens.extend(_source_chunks(text, scan, pos, at))
            rewritten = False
        tokens.append(Token(text[at:at + len(piece)], at, at + len(piece)))
        pos = at + len(piece)
    # Whatever a rewrite left unmatched at the end of the line is still text: keep it.
    tokens.extend(_source_chunks(text, scan, pos, end))
    return tokens


def tokenize_words(text: str) -> list[Token]:
    """Moses tokens of ``text`` (line by line) with offsets into ``text``."""
    scan = blank_out_controls(text)
    moses = _moses()
    tokens: list[Token] = []
    for line in _LINE_RE.finditer(scan):
        pieces = moses.tokenize(line.group(), escape=False)
        tokens.extend(_align(text, scan, pieces, line.start(), line.end()))
    return tokens


def split_sentences(text: str) -> list[Sentence]:
    """Moses tokens grouped into sentences by the shared rules."""
    return group_sentences(text, tokenize_words(text))
