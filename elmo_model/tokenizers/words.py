"""``elmo-store-words``: the tokenizer the bundled default model was trained with.

Words are runs of letters, digits and ``_`` that keep inner apostrophes and hyphens
(``don't``, ``step-dame``, ``O'Neill``: one token each); every other visible character is
a token of its own, so punctuation never glues onto a word. No clitic splitting, no
abbreviation rules (``Mr.`` is ``Mr .``).

Sentences are lines: ``elmo train`` made every non-empty line of its corpus one
``<S> ... </S>`` sequence, so each line (``\\n``, ``\\r\\n`` or ``\\r``, as Python reads
text files) with at least one token is one sentence here too, however long; the
pipeline windows long ones.

One difference from the model's training run: control and zero-width characters (BOM
included) separate tokens like spaces, where training made each a token of its own. The
training corpus held a single one (the BOM opening Moby Dick). Bump ``VERSION`` when any
rule changes.
"""

from __future__ import annotations

import re

from elmo_model.tokenizers.text import Sentence, Token, blank_out_controls

NAME = "elmo-store-words"
VERSION = "1"

_TOKEN_RE = re.compile(r"\w+(?:['’\-]\w+)*|[^\w\s]")
_LINE_RE = re.compile(r"[^\r\n]+")


def _tokens(text: str, scan: str, start: int, end: int) -> list[Token]:
    """The tokens of ``text[start:end]``, found in ``scan`` (its controls blanked out)."""
    return [Token(text[m.start():m.end()], m.start(), m.end())
            for m in _TOKEN_RE.finditer(scan, start, end)]


def tokenize_words(text: str) -> list[Token]:
    """Word and punctuation tokens of ``text``, with offsets."""
    scan = blank_out_controls(text)
    return _tokens(text, scan, 0, len(scan))


def split_sentences(text: str) -> list[Sentence]:
    """One sentence per line that has tokens (see the module docstring)."""
    scan = blank_out_controls(text)
    sentences: list[Sentence] = []
    for line in _LINE_RE.finditer(scan):
        tokens = tuple(_tokens(text, scan, line.start(), line.end()))
        if tokens:
            sentences.append(Sentence(tokens))
    return sentences
