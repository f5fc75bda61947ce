"""Sentence splitters compared: boundary F1 on hand-checked gold, and speed.

Candidates: the shared rule of ``elmo_model.tokenizers.text.group_sentences`` over
``elmo-store-ptb`` tokens (which keep ``Mr.`` whole) and over ``elmo-store-words`` tokens
(``Mr`` ``.``), the ``elmo-store-sentences`` tokenizer (the first rule's boundaries, the
second's tokens), and the PyPI splitters pysbd, syntok, sentencex, blingfire and nltk's
Punkt, both untrained and trained (unsupervised: it learns abbreviations, collocations and
sentence starters from raw text) on the plain-text corpus with the gold paragraphs left
out. A splitter that is not installed is reported and skipped; install the others into a
scratch directory to compare them, e.g. ``pip install --target /tmp/splitters pysbd syntok
sentencex blingfire nltk`` and run with ``PYTHONPATH=/tmp/splitters``.

Accuracy: ``tests/fixtures/sentences/gold.txt`` (boundary precision, recall, F1; see
``elmo_model.tokenizers.boundaries``). Speed: every line of ``data/sample`` as one
paragraph, median of the repeats, in characters per second.

    .venv/bin/python bench/sentence_splitters.py --repeats 3
    .venv/bin/python bench/sentence_splitters.py --classics /data/corpora --show-errors 5
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from elmo_model.tokenizers import get_tokenizer
from elmo_model.tokenizers.boundaries import (
    ends_of_spans,
    ends_of_strings,
    read_sentence_gold,
    score_boundaries,
)

REPO = Path(__file__).resolve().parent.parent
GOLD = REPO / "tests" / "fixtures" / "sentences" / "gold.txt"
SAMPLE = REPO / "data" / "sample"
DEFAULT_CLASSICS = REPO.parent / "shared" / "corpora"
PUNKT_TRAINING_CHARS = 2_000_000

Splitter = Callable[[str], frozenset[int]]


def _registered(tokenizer_name: str) -> Splitter:
    split = get_tokenizer(tokenizer_name).split_sentences
    return lambda text: ends_of_spans(text, [(s.start, s.end) for s in split(text)])


def _rule_on_words() -> Splitter:
    """The shared rule over elmo-store-words tokens (``Mr`` ``.``: no abbreviations)."""
    from elmo_model.tokenizers.text import group_sentences

    tokenize = get_tokenizer("elmo-store-words").tokenize
    return lambda text: ends_of_spans(
        text, [(s.start, s.end) for s in group_sentences(text, tokenize(text))])


def _pysbd() -> Splitter:
    import pysbd

    segmenter = pysbd.Segmenter(language="en", clean=False, char_span=True)
    return lambda text: ends_of_spans(text, [(s.start, s.end) for s in segmenter.segment(text)])


def _syntok() -> Splitter:
    from syntok import segmenter

    def split(text: str) -> frozenset[int]:
        spans = []
        for paragraph in segmenter.analyze(text):
            for sentence in paragraph:
                tokens = list(sentence)
                spans.append((tokens[0].offset, tokens[-1].offset + len(tokens[-1].value)))
        return ends_of_spans(text, spans)
    return split


def _sentencex() -> Splitter:
    from sentencex import segment

    return lambda text: ends_of_strings(text, segment("en", text))


def _blingfire() -> Splitter:
    import blingfire

    def split(text: str) -> frozenset[int]:
        _, offsets = blingfire.text_to_sentences_and_offsets(text)
        # blingfire's offsets count UTF-8 bytes; map them back to code points.
        encoded = text.encode("utf-8")
        return ends_of_spans(text, [(len(encoded[:s].decode("utf-8", "ignore")),
                                     len(encoded[:e].decode("utf-8", "ignore")))
                                    for s, e in offsets])
    return split


def _punkt(train: bool, gold_texts: set[str], classics: Path) -> Splitter:
    from nltk.tokenize.punkt import PunktSentenceTokenizer, PunktTrainer

    if not train:
        tokenizer = PunktSentenceTokenizer()
    else:
        lines = []
        paths = sorted(classics.glob("*.txt"))
        if not paths:
            raise SystemExit(f"no *.txt in {classics}: pass --classics DIR")
        for path in paths:
            lines += [line.strip() for line in path.open(encoding="utf-8")
                      if line.strip() and line.strip() not in gold_texts]
        trainer = PunktTrainer()
        trainer.INCLUDE_ALL_COLLOCS = True
        trainer.train("\n".join(lines)[:PUNKT_TRAINING_CHARS], finalize=True)
        tokenizer = PunktSentenceTokenizer(trainer.get_params())
    return lambda text: ends_of_spans(text, tokenizer.span_tokenize(text))


def candidates(gold_texts: set[str], classics: Path) -> dict[str, Callable[[], Splitter]]:
    return {
        "rule on elmo-store-ptb tokens": lambda: _registered("elmo-store-ptb"),
        "rule on elmo-store-words tokens": lambda: _rule_on_words(),
        "elmo-store-sentences (ptb boundaries, words tokens)":
            lambda: _registered("elmo-store-sentences"),
        "pysbd": _pysbd,
        "syntok": _syntok,
        "sentencex": _sentencex,
        "blingfire": _blingfire,
        "nltk punkt, untrained": lambda: _punkt(False, gold_texts, classics),
        "nltk punkt, trained on the classics": lambda: _punkt(True, gold_texts, classics),
    }


_MODULES = {"pysbd": "pysbd", "syntok": "syntok", "sentencex": "sentencex",
            "blingfire": "blingfire", "nltk": "nltk"}


def _installed(name: str) -> bool:
    module = next((m for key, m in _MODULES.items() if name.startswith(key)), None)
    return module is None or importlib.util.find_spec(module) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--classics", type=Path, default=DEFAULT_CLASSICS,
                        help="plain-text corpus Punkt trains on (default: ../shared/corpora)")
    parser.add_argument("--show-errors", type=int, default=0,
                        help="print this many missed and false boundaries per splitter")
    args = parser.parse_args()
    gold = read_sentence_gold(GOLD)
    speed_lines = [line for path in sorted(SAMPLE.glob("*.txt"))
                   for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    chars = sum(len(line) for line in speed_lines)
    print(f"gold: {len(gold)} paragraphs, {sum(len(g.ends) for g in gold)} boundaries; "
          f"speed: {len(speed_lines)} lines, {chars:,} characters")
    print("| splitter | precision | recall | F1 | chars/s |\n|---|---|---|---|---|")
    for name, make in candidates({g.text for g in gold}, args.classics).items():
        if not _installed(name):
            print(f"| {name} | not installed | | | |")
            continue
        split = make()
        predicted = [split(g.text) for g in gold]
        score = score_boundaries(gold, predicted)
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            for line in speed_lines:
                split(line)
            times.append(time.perf_counter() - started)
        print(f"| {name} | {score.precision:.3f} | {score.recall:.3f} | {score.f1:.3f} | "
              f"{chars / statistics.median(times):,.0f} |")
        for g, p in zip(gold, predicted, strict=True):
            for kind, ends in (("missed", g.ends - p), ("false", p - g.ends)):
                for end in sorted(ends)[:args.show_errors]:
                    before, after = g.text[max(0, end - 50):end], g.text[end:end + 30]
                    print(f"    {kind}: ...{before}|{after}...")


if __name__ == "__main__":
    main()
