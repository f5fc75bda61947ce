"""The PTB-like tokenizer (``elmo-store-ptb``), its sentence splitter and long-sentence
windows. The other tokenizers: ``test_tokenizers.py``."""

from __future__ import annotations

import itertools

import pytest

from elmo_model.tokenizers.ptb import NAME as TOKENIZER_NAME
from elmo_model.tokenizers.ptb import VERSION as TOKENIZER_VERSION
from elmo_model.tokenizers.ptb import split_sentences, tokenize_words
from pipeline.tokenize import get_tokenizer, windows


def words(text: str) -> list[str]:
    return [t.text for t in tokenize_words(text)]


def test_ptb_rules() -> None:
    assert words("I don't know, can't you? It's Mr. Smith's.") == [
        "I", "do", "n't", "know", ",", "ca", "n't", "you", "?", "It", "'s", "Mr.", "Smith",
        "'s", ".",
    ]
    assert words("Pay $3.14 or 1,000,000 at 10:30 -- well-known U.S. firm...") == [
        "Pay", "$", "3.14", "or", "1,000,000", "at", "10:30", "--", "well-known", "U.S.",
        "firm", "...",
    ]
    assert words("see https://example.org/a?b=1. mail me@x.org!") == [
        "see", "https://example.org/a?b=1", ".", "mail", "me@x.org", "!",
    ]
    assert words("O'Neill said \"no\" (twice)") == [
        "O'Neill", "said", '"', "no", '"', "(", "twice", ")",
    ]


def test_offsets_slice_the_source_and_controls_separate_tokens() -> None:
    text = "Ünïcode\x00text\ttabs\u200bzero — dash 😀 emoji\r\nnext"
    tokens = tokenize_words(text)
    for token in tokens:
        assert text[token.start:token.end] == token.text
    assert [t.text for t in tokens] == [
        "Ünïcode", "text", "tabs", "zero", "—", "dash", "😀", "emoji", "next",
    ]


def test_sentence_splitting() -> None:
    text = ('Mr. Brown went home. "Why?" she asked! He said no... then left.\n\n'
            "A new paragraph without a stop\n\nLast one e.g. here. 2 more")
    got = [" ".join(s.words) for s in split_sentences(text)]
    assert got == [
        "Mr. Brown went home .",
        '" Why ? " she asked !',  # lowercase after the quote: the same sentence
        "He said no ... then left .",
        "A new paragraph without a stop",
        "Last one e.g. here .",
        "2 more",
    ]
    for sentence in split_sentences(text):
        assert sentence.start < sentence.end


def test_module_functions_are_the_registered_ptb_tokenizer() -> None:
    ptb = get_tokenizer("elmo-store-ptb")
    assert ptb.record() == {"name": TOKENIZER_NAME, "version": TOKENIZER_VERSION}
    text = "Mr. Brown can't stay. \"Why?\" he asked.\n\nNew paragraph"
    assert ptb.split_sentences(text) == split_sentences(text)
    assert ptb.tokenize(text) == tokenize_words(text)


def test_long_token_kept_whole() -> None:
    long = "x" * 1000
    assert words(f"a {long} b") == ["a", long, "b"]


@pytest.mark.parametrize(("n", "size", "overlap"), [(5, 8, 2), (10, 4, 2), (600, 256, 32),
                                                    (257, 256, 0), (1000, 7, 6)])
def test_windows_store_every_token_once(n: int, size: int, overlap: int) -> None:
    spans = windows(n, size, overlap)
    owned = [i for w in spans for i in range(w.own_start, w.own_end)]
    assert owned == list(range(n))
    for w in spans:
        assert w.end - w.start <= size
        assert w.start <= w.own_start <= w.own_end <= w.end
    for a, b in itertools.pairwise(spans):
        assert a.end - b.start >= overlap  # consecutive windows overlap by at least that


def test_windows_reject_bad_settings() -> None:
    with pytest.raises(ValueError):
        windows(10, 4, 4)
    with pytest.raises(ValueError):
        windows(10, 0, 0)
