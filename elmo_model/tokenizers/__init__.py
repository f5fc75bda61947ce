"""Tokenizers, and the one each model declares.

A biLM only ever saw the tokens of its training corpus, so text must be cut into words
the same way at inference. Each model says how in its ``options.json``, beside bilm-tf's
``lstm`` and ``char_cnn`` sections (bilm-tf and AllenNLP read only those two)::

    "tokenizer": {"name": "elmo-store-words", "version": "1"}

Registered tokenizers (all give exact code-point offsets, ``token.text == doc[start:end]``):

- ``moses``: sacremoses' Moses tokenizer, English, unescaped, as the original ELMo
  weights saw (``don 't``). Weights that declare nothing (bilm-tf, AllenNLP) get this one,
  except elmo-store models trained before declarations existed (their options have a
  ``training`` block): those get ``elmo-store-words``. It is also ``elmo train``'s default
  for a new model.
- ``elmo-store-words``: words with inner apostrophes and hyphens, one line one sentence;
  the bundled default model was trained with it.
- ``elmo-store-sentences``: the same words, documents split into sentences (running text:
  JSONL records, paragraphs); line breaks inside a paragraph are spaces.
- ``elmo-store-ptb``: elmo-store's PTB-like tokenizer (``do n't``).

A version is ``RULES[+LIBRARY-RELEASE]``. Datasets record the whole version and refuse to
mix two; a model's declaration must match the rules part (a new sacremoses release does
not invalidate a model, a rule change of ours does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elmo_model.errors import ElmoUserError, SettingError
from elmo_model.options_file import OPTIONS_FILE, read_options_json
from elmo_model.tokenizers import moses, ptb, sentences, words
from elmo_model.tokenizers.text import Sentence, Token

DECLARATION_KEY = "tokenizer"
UNDECLARED = moses.NAME  # what AllenNLP / bilm-tf weights were trained on
TRAIN_DEFAULT = moses.NAME  # a new model is trained as the original ELMo was


@dataclass(frozen=True)
class Tokenizer:
    """A named, versioned sentence splitter + word tokenizer with exact character offsets."""

    name: str
    version: str
    split_sentences: Callable[[str], list[Sentence]]
    # The tokens of a text without sentence splitting (training reads lines).
    tokenize: Callable[[str], list[Token]]

    def record(self) -> dict[str, str]:
        """What a dataset records of its tokenizer (``_dataset.json``) and a model declares."""
        return {"name": self.name, "version": self.version}


def _rules(version: str) -> str:
    return version.partition("+")[0]


_FACTORIES: dict[str, Callable[[], Tokenizer]] = {
    moses.NAME: lambda: Tokenizer(moses.NAME, moses.full_version(), moses.split_sentences,
                                  moses.tokenize_words),
    ptb.NAME: lambda: Tokenizer(ptb.NAME, ptb.VERSION, ptb.split_sentences, ptb.tokenize_words),
    words.NAME: lambda: Tokenizer(words.NAME, words.VERSION, words.split_sentences,
                                  words.tokenize_words),
    sentences.NAME: lambda: Tokenizer(sentences.NAME, sentences.VERSION,
                                      sentences.split_sentences, sentences.tokenize_words),
}
_BUILT: dict[str, Tokenizer] = {}


def tokenizer_names() -> tuple[str, ...]:
    return tuple(sorted(_FACTORIES))


def get_tokenizer(name: str) -> Tokenizer:
    """The tokenizer called ``name``; an :class:`ElmoUserError` naming the known ones if none."""
    if name not in _FACTORIES:
        raise ElmoUserError(f"unknown tokenizer {name!r}; known: {', '.join(tokenizer_names())}")
    if name not in _BUILT:
        _BUILT[name] = _FACTORIES[name]()
    return _BUILT[name]


def declared_tokenizer(options: dict[str, Any], source: str, check_version: bool = True) -> str:
    """The tokenizer name parsed ``options`` declare (:data:`UNDECLARED` when none);
    ``source`` names the file in error messages. With ``check_version`` a declared version
    whose rules differ from this elmo-store's is an error."""
    declared = options.get(DECLARATION_KEY) if isinstance(options, dict) else None
    if declared is None:
        # elmo train wrote a "training" block before it wrote declarations, and then it
        # always tokenized with elmo-store-words; bilm-tf's options have no such block.
        return words.NAME if isinstance(options, dict) and "training" in options else UNDECLARED
    fix = (f"write \"{DECLARATION_KEY}\": {{\"name\": NAME, \"version\": VERSION}} with NAME one "
           f"of {', '.join(tokenizer_names())}, or pass the tokenizer NAME to use")
    if not isinstance(declared, dict) or not isinstance(declared.get("name"), str):
        raise ElmoUserError(f"{source}: bad tokenizer declaration {declared!r}; {fix}")
    name = declared["name"]
    if name not in _FACTORIES:
        raise ElmoUserError(f"{source}: the model declares tokenizer {name!r}, which this "
                            f"elmo-store does not have; known: {', '.join(tokenizer_names())}")
    wanted = declared.get("version")
    if check_version and wanted is not None:
        have = get_tokenizer(name).version
        if not isinstance(wanted, str) or _rules(wanted) != _rules(have):
            raise SettingError("tokenizer", lambda setting: (
                f"{source}: the model was trained with tokenizer {name} version {wanted!r}, "
                f"this elmo-store has version {have!r} (other rules); pass "
                f"{setting('tokenizer')} {name} to use it anyway"))
    return name


def model_tokenizer(options_path: str) -> str:
    """The tokenizer name a model declares in its ``options.json`` (the file, or the model
    directory holding it); :data:`UNDECLARED` (``moses``) for weights that declare none."""
    path = Path(options_path)
    if path.is_dir():
        path = path / OPTIONS_FILE
    return declared_tokenizer(read_options_json(path), str(path))


__all__ = [
    "DECLARATION_KEY",
    "TRAIN_DEFAULT",
    "UNDECLARED",
    "Sentence",
    "Token",
    "Tokenizer",
    "declared_tokenizer",
    "get_tokenizer",
    "model_tokenizer",
    "tokenizer_names",
]
