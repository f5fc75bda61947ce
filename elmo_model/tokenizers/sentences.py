"""``elmo-store-sentences``: ``elmo-store-words`` tokens, documents split into sentences.

The bundled model's tokenizer (``elmo-store-words``) takes one line as one sentence, as its
training corpus was cut. Running text is not: a State of the Union address stored as one
JSONL record became one "sentence" of 2,000 tokens. This tokenizer gives the very same
tokens (so a model trained with either reads the other's), grouped into sentences by the
shared rules of :func:`elmo_model.tokenizers.text.group_sentences` applied to
``elmo-store-ptb`` tokens, which keep titles, initials and abbreviations whole (``Mr.``,
``U.S.``, ``e.g.``) so that their periods end no sentence. Line breaks inside a paragraph
are spaces (hard-wrapped text reads as one paragraph); a blank line always ends a sentence.

That rule was kept after comparing it with the PyPI splitters (pysbd, syntok, sentencex,
blingfire, nltk's Punkt) on hand-checked gold (``bench/sentence_splitters.py``,
BENCHMARKS.md): it had the best boundary F1. For corpora cut one sentence a line, use
``elmo-store-words``. Bump ``VERSION`` when any rule changes (a rule change in
``elmo-store-ptb`` or ``elmo-store-words`` changes this one too).
"""

from __future__ import annotations

from bisect import bisect_right

from elmo_model.tokenizers import ptb, words
from elmo_model.tokenizers.text import Sentence, Token, group_sentences

NAME = "elmo-store-sentences"
VERSION = "1"


def tokenize_words(text: str) -> list[Token]:
    """The ``elmo-store-words`` tokens of ``text``."""
    return words.tokenize_words(text)


def split_sentences(text: str) -> list[Sentence]:
    """``elmo-store-words`` tokens grouped into the sentences found on ``elmo-store-ptb``
    tokens. A sentence boundary always falls between two tokens of both tokenizers (it
    follows a stop or a closing mark, which both cut off), so each word token goes to the
    sentence its first character is in."""
    starts = [sentence.start for sentence in group_sentences(text, ptb.tokenize_words(text))]
    sentences: list[Sentence] = []
    current: list[Token] = []
    index = 0
    for token in words.tokenize_words(text):
        at = bisect_right(starts, token.start) - 1
        if at != index and current:
            sentences.append(Sentence(tuple(current)))
            current = []
        index = at
        current.append(token)
    if current:
        sentences.append(Sentence(tuple(current)))
    return sentences
