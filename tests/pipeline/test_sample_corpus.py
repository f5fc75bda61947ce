"""The bundled sample corpus (``data/sample``) holds no repeated text.

A repeated paragraph shows up twice in every search over the sample (the demo once
listed one Austen sentence as ``austen.txt:121`` and again as ``play.txt:1``).
"""

from __future__ import annotations

from collections import defaultdict

from helpers import REPO

from pipeline.tokenize import get_tokenizer

SAMPLE = REPO / "data" / "sample"
# Shorter sentences recur in the books themselves ("God saw that it was good.", "Ready.").
MIN_REPEATED_SENTENCE_TOKENS = 8


def _lines() -> list[tuple[str, str]]:
    """(file:line, text) for every non-empty line of the sample."""
    return [(f"{path.name}:{number}", line)
            for path in sorted(SAMPLE.glob("*.txt"))
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if line.strip()]


def _repeats(keyed: list[tuple[str, str]]) -> dict[str, list[str]]:
    places: dict[str, list[str]] = defaultdict(list)
    for where, text in keyed:
        places[" ".join(text.lower().split())].append(where)
    return {text: where for text, where in places.items() if len(where) > 1}


def test_sample_has_its_files_and_licence_note() -> None:
    names = {p.name for p in SAMPLE.glob("*.txt")}
    assert {"austen.txt", "moby_dick.txt", "play.txt", "shakespeare.txt",
            "web_bible.txt"} <= names
    readme = (SAMPLE / "README.md").read_text(encoding="utf-8")
    assert "public domain" in readme
    rows = {line.split("|")[1].strip(): line.split("|")[-2].strip()
            for line in readme.splitlines() if line.startswith("| ") and ".txt" in line}
    for name in names:  # each file is described, with its current line count
        n_lines = len((SAMPLE / name).read_text(encoding="utf-8").splitlines())
        assert rows.get(name) == str(n_lines), (name, rows.get(name), n_lines)


def test_no_line_occurs_twice() -> None:
    assert _repeats(_lines()) == {}


def test_no_long_sentence_occurs_twice() -> None:
    tokenizer = get_tokenizer("elmo-store-ptb")
    sentences = []
    for where, line in _lines():
        for sentence in tokenizer.split_sentences(line):
            words = [token.text for token in sentence.tokens]
            if len(words) >= MIN_REPEATED_SENTENCE_TOKENS:
                sentences.append((where, " ".join(words)))
    assert _repeats(sentences) == {}
