"""The tokenizer registry: exact offsets for every tokenizer, Moses reference outputs, the
bundled model's tokenizer, and the tokenizer a model declares."""

from __future__ import annotations

import json
import pickle
import random
import unicodedata
from pathlib import Path

import pytest
from helpers import REPO
from sacremoses import MosesTokenizer

from elmo_model.errors import ElmoUserError
from elmo_model.tokenizers import moses
from elmo_model.tokenizers.boundaries import (
    ends_of_spans,
    ends_of_strings,
    read_sentence_gold,
    score_boundaries,
)
from pipeline.tokenize import Token, get_tokenizer, model_tokenizer, tokenizer_names

DEFAULT_MODEL = REPO / "models" / "default"
SENTENCE_GOLD = REPO / "tests" / "fixtures" / "sentences" / "gold.txt"

TRICKY = (
    "Ünïcode\x00text\ttabs\u200bzero — dash 😀 emoji\r\n“Don’t,” she said; it's O'Neill's "
    "café at https://example.org/a?b=1. e\u0301 ﬁne 👩\u200d👩\u200d👧 x\xa0y ‘quoted’ \ufeffBOM "
    "10:30 $5.00 mail me@x.org!\n\n\x1f\x7fA DOTMULTI b... (U.S.A.) won't-stop «ok» 3.14%"
)


def _is_gap(ch: str) -> bool:
    """Characters no token may hold: spaces, controls, zero-width and BOM."""
    zero_width = "\u200b\u200c\u200d\u2060\ufeff"
    return ch.isspace() or unicodedata.category(ch) == "Cc" or ch in zero_width


def _all_tokens(name: str, text: str) -> list[Token]:
    return [t for sentence in get_tokenizer(name).split_sentences(text) for t in sentence.tokens]


def _assert_exact_cover(name: str, text: str) -> None:
    """Every token is its source slice, in order, and together they hold every visible
    character: nothing lost, nothing invented."""
    tokens = _all_tokens(name, text)
    assert tokens == get_tokenizer(name).tokenize(text)  # sentences only group, never cut
    covered: set[int] = set()
    last_end = 0
    for token in tokens:
        assert token.text == text[token.start:token.end]
        assert token.start >= last_end and token.end > token.start
        assert not any(_is_gap(ch) for ch in token.text), token
        covered.update(range(token.start, token.end))
        last_end = token.end
    assert covered == {i for i, ch in enumerate(text) if not _is_gap(ch)}, (name, text)


@pytest.mark.parametrize("name", tokenizer_names())
def test_offsets_slice_the_source_and_cover_every_visible_character(name: str) -> None:
    _assert_exact_cover(name, TRICKY)


@pytest.mark.parametrize("name", tokenizer_names())
def test_offsets_hold_on_random_character_soup(name: str) -> None:
    # pieces chosen to provoke Moses' rewrites (DOTMULTI), clitics and abbreviations
    pieces = [*"aZ09 .,;:!?'\"’“”-—()<>&@$%_/|\n\t\r\x00\x1f\x85\u200b\ufeff\xa0\u2028😀é\u0301ﬁ",
              "DOTMULTI", "DOTDOTMULTI", "n't", "'s", "http://a.b/c", "...", "U.S.", "Mr."]
    rng = random.Random(1)
    for _ in range(400):
        _assert_exact_cover(name, "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))))


# Outputs of sacremoses 0.2.0, MosesTokenizer(lang="en").tokenize(text, escape=False),
# recorded by running it; aggressive dash splitting is off, as in Moses by default.
MOSES_REFERENCE = {
    "don't": "don 't",
    "It's raining.": "It 's raining .",
    "I can't go, won't go.": "I can 't go , won 't go .",
    "You're we've they'll I'd I'm": "You 're we 've they 'll I 'd I 'm",
    "O'Neill's dog": "O 'Neill 's dog",
    "students' books": "students ' books",
    "rock 'n' roll": "rock ' n ' roll",
    "don’t": "don ’ t",  # Moses splits only the straight apostrophe as a clitic
    "U.S.A. is big.": "U.S.A. is big .",
    "Mr. Smith went home. He slept.": "Mr. Smith went home . He slept .",
    "It costs $5.00 today.": "It costs $ 5.00 today .",
    "1,000,000 people at 10:30": "1,000,000 people at 10 : 30",
    "50%": "50 %",
    "hello-world": "hello-world",
    "Wait... what?": "Wait ... what ?",
    '"Hi," she said.': '" Hi , " she said .',
    "a & b < c": "a & b < c",  # unescaped: no &amp; / &lt;
    # a line's last period is split off, an inner "1." before a lowercase word is not
    "see https://example.org/a?b=1.": "see https : / / example.org / a ? b = 1 .",
    "see https://example.org/a?b=1. ok": "see https : / / example.org / a ? b = 1. ok",
    "mail me@x.org!": "mail me @ x.org !",
}


@pytest.mark.parametrize(("text", "expected"), MOSES_REFERENCE.items())
def test_moses_reference_outputs(text: str, expected: str) -> None:
    assert [t.text for t in get_tokenizer("moses").tokenize(text)] == expected.split(" ")


def test_moses_tokens_are_sacremoses_tokens(corpora_dir: Path) -> None:
    """Alignment adds offsets and nothing else, and our faster predicates change nothing:
    the strings are plain sacremoses' own."""
    reference = MosesTokenizer(lang="en")
    sample = "\n".join(p.read_text(encoding="utf-8") for p in sorted(corpora_dir.glob("*.txt")))
    lines = [*MOSES_REFERENCE, "“Don’t,” she said; it's café at 10:30 (U.S.A.) «ok» 3.14%",
             "The 'quoted' words... and more!", "Mr. élan, x. Ünder, A. b, No. 5, it. ǅx",
             *sample.splitlines()[::4]]
    for line in lines:
        assert [t.text for t in get_tokenizer("moses").tokenize(line)] == \
            reference.tokenize(line, escape=False)


def test_moses_rewrites_keep_the_source_text() -> None:
    """sacremoses turns a literal DOTMULTI into "."; the token keeps the source slice."""
    text = "x DOTMULTI test ."
    assert MosesTokenizer(lang="en").tokenize(text, escape=False) == ["x", ".", "test", "."]
    tokens = get_tokenizer("moses").tokenize(text)
    assert [(t.text, t.start, t.end) for t in tokens] == [
        ("x", 0, 1), ("DOTMULTI", 2, 10), ("test", 11, 15), (".", 16, 17)]


def test_moses_rewrite_with_an_ambiguous_resync_loses_nothing() -> None:
    # "...1" is not in the source; the next piece "." is found one character early, so
    # the rest of the line is kept as source chunks
    text = "X&.^.DOTDOTMULTI1\u2028DOTMULTI"
    assert "...1" in MosesTokenizer(lang="en").tokenize(text, escape=False)
    _assert_exact_cover("moses", text)


def test_moses_controls_separate_words_instead_of_gluing_them() -> None:
    # sacremoses alone deletes control characters: "nul\x00here" -> "nulhere"
    assert MosesTokenizer(lang="en").tokenize("nul\x00here", escape=False) == ["nulhere"]
    assert [t.text for t in get_tokenizer("moses").tokenize("nul\x00here")] == ["nul", "here"]


def test_moses_sentences_follow_the_shared_rules() -> None:
    text = ('Mr. Brown went home. "Why?" she asked! He said no... then left.\n\n'
            "A new paragraph without a stop\n\nLast one e.g. here. 2 more")
    expected = [
        "Mr. Brown went home .",
        '" Why ? " she asked !',
        "He said no ... then left .",
        "A new paragraph without a stop",
        "Last one e.g. here .",
        "2 more",
    ]
    assert [" ".join(s.words) for s in get_tokenizer("moses").split_sentences(text)] == expected
    # the same boundaries as the PTB-like tokenizer: one rule set, whatever the words
    ptb = get_tokenizer("elmo-store-ptb").split_sentences(text)
    assert [(s.start, s.end) for s in ptb] == \
        [(s.start, s.end) for s in get_tokenizer("moses").split_sentences(text)]


def test_words_tokenizer_keeps_words_whole_and_reads_lines() -> None:
    words = get_tokenizer("elmo-store-words")
    assert [t.text for t in words.tokenize("Mr. Smith's step-dame don't, 3.14!")] == [
        "Mr", ".", "Smith's", "step-dame", "don't", ",", "3", ".", "14", "!"]
    text = "Dr. Who? He left.\r\nline two\rline three\n\n  \n\x00\u200b\nlast"
    sentences = words.split_sentences(text)
    # one sentence per line, as training cut its corpus; lines without tokens give none
    assert [" ".join(s.words) for s in sentences] == [
        "Dr . Who ? He left .", "line two", "line three", "last"]
    assert [text[s.start:s.end] for s in sentences] == [
        "Dr. Who? He left.", "line two", "line three", "last"]


def test_sentences_tokenizer_cuts_running_text_into_sentences() -> None:
    text = ("Mr. and Mrs. Okafor moved to St. Louis in 1998, e.g. for work. Their daughter\n"
            "studied at M.I.T. in Cambridge! \"Why there?\" her uncle asked. She said nothing."
            "\n\nA new paragraph ends the last sentence even without a stop\nThis one")
    sentences = get_tokenizer("elmo-store-sentences").split_sentences(text)
    assert [text[s.start:s.end] for s in sentences] == [
        "Mr. and Mrs. Okafor moved to St. Louis in 1998, e.g. for work.",
        "Their daughter\nstudied at M.I.T. in Cambridge!",  # a line break inside is a space
        '"Why there?" her uncle asked.',
        "She said nothing.",
        "A new paragraph ends the last sentence even without a stop\nThis one"]
    # the words are elmo-store-words', whatever the sentences: the bundled model's vocabulary
    assert [t for s in sentences for t in s.tokens] == \
        get_tokenizer("elmo-store-words").tokenize(text)
    assert sentences[0].words[:4] == ["Mr", ".", "and", "Mrs"]


def test_sentences_tokenizer_leaves_the_line_tokenizer_as_it_was() -> None:
    """Datasets embedded with elmo-store-words version 1 keep their meaning: one line of
    running text is still one sentence there."""
    address = " ".join(f"Sentence number {i} ends here." for i in range(200))
    assert len(get_tokenizer("elmo-store-words").split_sentences(address)) == 1
    assert get_tokenizer("elmo-store-words").record() == {"name": "elmo-store-words",
                                                          "version": "1"}
    assert len(get_tokenizer("elmo-store-sentences").split_sentences(address)) == 200


def test_sentence_boundaries_match_the_hand_checked_gold() -> None:
    """bench/sentence_splitters.py compares this rule with the PyPI splitters on the same
    gold; it scored F1 0.994 there (BENCHMARKS.md)."""
    gold = read_sentence_gold(SENTENCE_GOLD)
    assert len(gold) >= 90 and sum(len(g.ends) for g in gold) >= 300
    split = get_tokenizer("elmo-store-sentences").split_sentences
    score = score_boundaries(gold, [ends_of_spans(g.text, [(s.start, s.end) for s in split(
        g.text)]) for g in gold])
    assert score.precision >= 0.99 and score.recall >= 0.98 and score.f1 >= 0.99, score
    lines = score_boundaries(gold, [ends_of_spans(g.text, [(s.start, s.end) for s in get_tokenizer(
        "elmo-store-words").split_sentences(g.text)]) for g in gold])
    assert lines.recall == 0.0  # one paragraph, one "sentence"


def test_boundary_scores_count_ends_inside_paragraphs(tmp_path: Path) -> None:
    gold_file = tmp_path / "gold.txt"
    gold_file.write_text("# a comment\nOne.\nTwo?\n\nThree\n", encoding="utf-8")
    gold = read_sentence_gold(gold_file)
    assert [(g.text, sorted(g.ends)) for g in gold] == [("One. Two?", [4]), ("Three", [])]
    assert ends_of_strings("One. Two?", [" One.", "Two?"]) == {4}
    score = score_boundaries(gold, [frozenset({4, 2}), frozenset()])
    assert (score.true_positives, score.predicted, score.gold) == (1, 2, 1)
    assert (score.precision, score.recall) == (0.5, 1.0)


def test_bundled_model_declares_the_tokenizer_it_learned() -> None:
    assert model_tokenizer(str(DEFAULT_MODEL / "options.json")) == "elmo-store-sentences"
    assert model_tokenizer(str(DEFAULT_MODEL)) == "elmo-store-sentences"  # the directory too
    vocab = set((DEFAULT_MODEL / "vocab.txt").read_text(encoding="utf-8").split("\n"))
    sentence = "Mr. Darcy said, \"I don't know.\""
    declared = [t.text for t in get_tokenizer(model_tokenizer(str(DEFAULT_MODEL))).tokenize(
        sentence)]
    assert set(declared) <= vocab  # every token one the model was trained to predict
    for other in ("moses", "elmo-store-ptb"):
        unseen = {t.text for t in get_tokenizer(other).tokenize(sentence)} - vocab
        assert unseen  # "'t" / "n't" / "Mr.": tokens this model never saw in training


def test_declared_tokenizer_cuts_the_unknown_words_on_the_sample(corpora_dir: Path) -> None:
    """The bundled sample comes from the model's training text: cut as in training, far
    fewer of its tokens fall outside the model's vocabulary than with the other two. (The
    vocabulary is the 50,000 most frequent words of the whole training corpus, of which
    the classics are a quarter.)"""
    vocab = set((DEFAULT_MODEL / "vocab.txt").read_text(encoding="utf-8").split("\n"))
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(corpora_dir.glob("*.txt")))

    def unknown_share(name: str) -> float:
        tokens = get_tokenizer(name).tokenize(text)
        return sum(t.text not in vocab for t in tokens) / len(tokens)

    declared = unknown_share(model_tokenizer(str(DEFAULT_MODEL)))
    assert declared < 0.03  # 2.2% measured; MODEL_CARD gives the held-out rates
    for other in ("moses", "elmo-store-ptb"):
        # 0.63 of moses's share measured (0.46 with the first model's classics vocabulary)
        assert declared < 0.7 * unknown_share(other)


def test_weights_that_declare_nothing_get_moses(elmo_fixture_dir: Path) -> None:
    assert model_tokenizer(str(elmo_fixture_dir / "options.json")) == "moses"


def _options_with(tmp_path: Path, **extra: object) -> str:
    options = json.loads((DEFAULT_MODEL / "options.json").read_text())
    options.pop("tokenizer")
    options.update(extra)
    path = tmp_path / "options.json"
    path.write_text(json.dumps(options))
    return str(path)


def test_declarations_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ElmoUserError, match="does not have; known: elmo-store-ptb, "
                                            "elmo-store-sentences, elmo-store-words, moses"):
        model_tokenizer(_options_with(tmp_path, tokenizer={"name": "spacy"}))
    with pytest.raises(ElmoUserError, match="bad tokenizer declaration"):
        model_tokenizer(_options_with(tmp_path, tokenizer="moses"))
    with pytest.raises(ElmoUserError, match="pass tokenizer elmo-store-ptb"):
        model_tokenizer(_options_with(tmp_path, tokenizer={"name": "elmo-store-ptb",
                                                           "version": "0"}))
    with pytest.raises(ElmoUserError, match="options file not found"):
        model_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ElmoUserError, match="not valid JSON"):
        model_tokenizer(str(tmp_path / "broken.json"))


def test_declaration_versions_compare_rules_not_library_releases(tmp_path: Path) -> None:
    other_release = f"{moses.RULES_VERSION}+sacremoses-0.0.1"
    assert get_tokenizer("moses").version != other_release
    assert model_tokenizer(_options_with(tmp_path, tokenizer={
        "name": "moses", "version": other_release})) == "moses"
    # no version: the name is enough
    assert model_tokenizer(_options_with(tmp_path, tokenizer={"name": "elmo-store-ptb"})) == \
        "elmo-store-ptb"


def test_elmo_store_models_from_before_declarations_get_their_tokenizer(tmp_path: Path) -> None:
    # options with elmo train's "training" block but no declaration: trained with the words one
    assert model_tokenizer(_options_with(tmp_path)) == "elmo-store-words"


def test_records_tell_every_tokenizer_apart() -> None:
    records = [get_tokenizer(name).record() for name in tokenizer_names()]
    assert all(set(r) == {"name", "version"} and r["version"] for r in records)
    assert len({json.dumps(r, sort_keys=True) for r in records}) == len(records)
    assert get_tokenizer("elmo-store-ptb").record() == {"name": "elmo-store-ptb", "version": "1"}
    assert "sacremoses" in get_tokenizer("moses").version  # a new release is a new version


@pytest.mark.parametrize("name", tokenizer_names())
def test_tokenizers_travel_to_workers(name: str) -> None:
    """Ray ships the tokenizer to its actors by pickling it."""
    tokenizer = get_tokenizer(name)
    copy = pickle.loads(pickle.dumps(tokenizer))
    assert copy.record() == tokenizer.record()
    assert copy.split_sentences(TRICKY) == tokenizer.split_sentences(TRICKY)


def test_unknown_tokenizer_names_the_known_ones() -> None:
    known = "elmo-store-ptb, elmo-store-sentences, elmo-store-words, moses"
    with pytest.raises(ElmoUserError, match=f"known: {known}"):
        get_tokenizer("nltk")
