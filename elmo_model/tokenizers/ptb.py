"""``elmo-store-ptb``: a deterministic Penn-Treebank-like word tokenizer with offsets.

This is elmo-store's own tokenizer, the one the pipeline used before models declared
theirs. No published ELMo model was trained on it: the original weights saw Moses tokens
(``moses``), the bundled default model ``elmo-store-words``. It follows PTB conventions
(``don't`` -> ``do n't``), except that a token's text is always the source slice, so
quotes stay ``"`` instead of PTB's `````/``''``. The rules, in order of priority:

1. URLs (``http(s)://...``, trailing punctuation excluded) and e-mail addresses: one token.
2. Numbers with inner separators (``3.14``, ``1,000,000``, ``10:30``): one token.
3. Abbreviations: a known title/short form plus its period (``Mr.``, ``Dr.``, ``etc.``,
   ``e.g.``), letter-period sequences (``U.S.``, ``e.g.``) and single capital initials
   (``J.``): the period stays on the token and ends no sentence.
4. Words: letters and digits, with inner hyphens and apostrophes (``well-known``,
   ``O'Neill``). Clitics are split off as in PTB: ``don't`` -> ``do n't``,
   ``can't`` -> ``ca n't``, ``it's`` -> ``it 's``, also ``'m 'd 'll 're 've``.
5. ``...`` (or ``…``) and dash runs (``--``, ``—``, ``–``): one token each.
6. Any other visible character is a token of its own (punctuation, symbols, emoji).

Control and zero-width characters separate tokens like spaces. Sentences follow the shared
rules of :func:`elmo_model.tokenizers.text.group_sentences`. Bump ``VERSION`` when any
rule changes: datasets record it and refuse to mix versions.
"""

from __future__ import annotations

import re

from elmo_model.tokenizers.text import Sentence, Token, blank_out_controls, group_sentences

NAME = "elmo-store-ptb"
VERSION = "1"

_ABBREVIATIONS = (
    "Mr|Mrs|Ms|Messrs|Dr|Prof|Sr|Jr|St|Mt|Ft|Rev|Hon|Gen|Gov|Capt|Col|Lt|Sgt|Maj|Cmdr|Adm|"
    "Pres|Sen|Rep|Inc|Ltd|Co|Corp|Bros|No|Nos|Vol|Vols|Fig|Figs|Ch|Sec|pp|p|vs|etc|cf|al|"
    "approx|dept|est|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
)

_TOKEN_RE = re.compile(
    r"""
    (?P<url>https?://[^\s<>"]*[^\s<>".,;:!?)\]}'])
  | (?P<email>[\w.+-]+@[\w-]+(?:\.[\w-]+)+)
  | (?P<number>\d+(?:[.,:]\d+)+)
  | (?P<abbr>(?<![^\W_])(?:(?:[^\W\d_]\.){2,}|(?:""" + _ABBREVIATIONS + r""")\.|[A-Z]\.)(?![^\W_]))
  | (?P<word>[^\W_]+(?:[-'’][^\W_]+)*)
  | (?P<ellipsis>\.{3,}|…)
  | (?P<dash>-{2,}|—|–)
  | (?P<other>\S)
    """,
    re.VERBOSE,
)
_CLITIC_RE = re.compile(r"(?i)(?:n['’]t|['’](?:s|m|d|ll|re|ve))$")


def tokenize_words(text: str) -> list[Token]:
    """Split ``text`` into PTB-like tokens with offsets (rules in the module docstring)."""
    scan = blank_out_controls(text)
    tokens: list[Token] = []
    for match in _TOKEN_RE.finditer(scan):
        start, end = match.span()
        piece = text[start:end]
        if match.lastgroup == "word":
            clitic = _CLITIC_RE.search(piece)
            # Only split a clitic off a longer word: a bare "n't" or "'s" stays whole.
            if clitic and clitic.start() > 0:
                cut = start + clitic.start()
                tokens.append(Token(text[start:cut], start, cut))
                tokens.append(Token(text[cut:end], cut, end))
                continue
        tokens.append(Token(piece, start, end))
    return tokens


def split_sentences(text: str) -> list[Sentence]:
    """Tokenize ``text`` and group the tokens into sentences."""
    return group_sentences(text, tokenize_words(text))
