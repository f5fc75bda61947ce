"""A deterministic PTB-like sentence splitter and word tokenizer with character offsets.

The ELMo models were trained on Penn-Treebank-style tokens (the 1B Word Benchmark), so
we tokenize the same way, with one difference: a token's text is always exactly the
slice ``text[char_start:char_end]`` of the document (offsets in Unicode code points), so
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

Control characters (Unicode category Cc, NUL included) and zero-width/BOM characters
separate tokens like spaces and never appear in them.

Sentences end after ``.``, ``!``, ``?`` (or a run of them, or ``...``) plus any closing
quotes/brackets that touch it, when the next token starts with an uppercase letter, a digit or an
opening quote/bracket, or when the text ends; a blank line (paragraph break) always
ends a sentence. Sentences longer than ``max_tokens`` are cut into overlapping windows
for the model (see ``windows``), but stored as one sentence.

``TOKENIZER_VERSION`` is recorded in every dataset: bump it when any rule changes.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from elmo_model.errors import ElmoUserError

TOKENIZER_NAME = "elmo-store-ptb"
TOKENIZER_VERSION = "1"

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
_SENTENCE_END = {".", "!", "?", "...", "…"}
_CLOSERS = set("\"'”’)]}»")
_OPENERS = set("\"'“‘([{«")
_PARAGRAPH_RE = re.compile(r"\n[ \t\r\f\v]*\n")
# Characters that act as whitespace but are not matched by \s.
_INVISIBLE = {"\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"}


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


def _blank_out_controls(text: str) -> str:
    """Same-length copy where control/invisible characters are spaces, so offsets hold."""
    if text.isprintable():
        return text
    return "".join(
        " " if (unicodedata.category(ch) == "Cc" and ch not in "\n\t\r\f\v") or ch in _INVISIBLE
        else ch
        for ch in text
    )


def tokenize_words(text: str) -> list[Token]:
    """Split ``text`` into PTB-like tokens with offsets (rules in the module docstring)."""
    scan = _blank_out_controls(text)
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


def _starts_sentence(token: Token) -> bool:
    first = token.text[0]
    return first.isupper() or first.isdigit() or first in _OPENERS


def split_sentences(text: str) -> list[Sentence]:
    """Tokenize ``text`` and group the tokens into sentences (rules in the module docstring)."""
    tokens = tokenize_words(text)
    breaks = {m.start() for m in _PARAGRAPH_RE.finditer(text)}
    break_points = sorted(breaks)
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
        if token.text in _SENTENCE_END or (
            len(token.text) > 1 and set(token.text) <= {".", "!", "?"}
        ):
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


@dataclass(frozen=True)
class Window:
    """Tokens ``[start, end)`` of a sentence go through the model together; only the
    tokens ``[own_start, own_end)`` are stored from this window, so each token is stored
    exactly once, from the window in which it has the most context on both sides."""

    start: int
    end: int
    own_start: int
    own_end: int


def windows(n_tokens: int, max_tokens: int, overlap: int) -> list[Window]:
    """Cover ``n_tokens`` with windows of at most ``max_tokens`` overlapping by ``overlap``.

    Where two windows overlap, the first half of the overlap is owned by the earlier
    window and the second half by the later one.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    if not 0 <= overlap < max_tokens:
        raise ValueError("overlap must be >= 0 and < max_tokens")
    if n_tokens <= max_tokens:
        return [Window(0, n_tokens, 0, n_tokens)]
    step = max_tokens - overlap
    starts = sorted({*range(0, n_tokens - max_tokens, step), n_tokens - max_tokens})
    out = []
    for k, start in enumerate(starts):
        end = start + max_tokens
        own_start = 0 if k == 0 else out[-1].own_end
        if k + 1 < len(starts):
            next_start = starts[k + 1]
            own_end = next_start + (end - next_start) // 2
        else:
            own_end = n_tokens
        out.append(Window(start, end, own_start, own_end))
    return out


# --------------------------------------------------------------------------- registry
# Interface the pipeline, sense search and training use; the tokenizer work fills in the
# other tokenizers (moses, the bundled model's) and the model declaration.


@dataclass(frozen=True)
class Tokenizer:
    """A named, versioned sentence splitter + word tokenizer with exact character offsets."""

    name: str
    version: str
    split: Callable[[str], list[Sentence]]

    def split_sentences(self, text: str) -> list[Sentence]:
        return self.split(text)

    def record(self) -> dict[str, str]:
        """What a dataset records of its tokenizer (``_dataset.json``)."""
        return {"name": self.name, "version": self.version}


_TOKENIZERS: dict[str, Tokenizer] = {
    TOKENIZER_NAME: Tokenizer(TOKENIZER_NAME, TOKENIZER_VERSION, split_sentences),
}


def tokenizer_names() -> tuple[str, ...]:
    return tuple(sorted(_TOKENIZERS))


def get_tokenizer(name: str) -> Tokenizer:
    """The tokenizer called ``name``; an :class:`ElmoUserError` naming the known ones if none."""
    try:
        return _TOKENIZERS[name]
    except KeyError:
        raise ElmoUserError(f"unknown tokenizer {name!r}; known: "
                            f"{', '.join(tokenizer_names())}") from None


def model_tokenizer(options_path: str) -> str:
    """The tokenizer name a model declares in its files (see the tokenizer docs)."""
    return TOKENIZER_NAME
