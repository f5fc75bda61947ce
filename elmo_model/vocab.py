"""Word vocabulary for the biLM's softmax.

The char CNN reads any token, so the vocabulary only decides what the language-model
softmax can *predict*: the ``max_size`` most frequent words plus ``<S>``, ``</S>`` and
``<UNK>`` (rarer words are predicted as ``<UNK>``). The file format is bilm-tf's: one
token per line, most frequent first, the three specials on top.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from elmo_model.char_ids import BOS_TOKEN, EOS_TOKEN
from elmo_model.errors import ElmoUserError

UNK_TOKEN = "<UNK>"
SPECIALS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)


class Vocabulary:
    """Token <-> id for the softmax. Ids 0, 1, 2 are ``<S>``, ``</S>``, ``<UNK>``."""

    def __init__(self, words: Iterable[str]) -> None:
        self.words: list[str] = list(SPECIALS)
        seen = set(SPECIALS)
        for word in words:
            if word not in seen:
                seen.add(word)
                self.words.append(word)
        self._ids = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    @property
    def bos(self) -> int:
        return 0

    @property
    def eos(self) -> int:
        return 1

    @property
    def unk(self) -> int:
        return 2

    def id(self, token: str) -> int:
        return self._ids.get(token, 2)

    def ids(self, tokens: Iterable[str]) -> list[int]:
        get = self._ids.get
        return [get(t, 2) for t in tokens]

    @classmethod
    def build(cls, sentences: Iterable[list[str]], max_size: int, min_count: int = 1
              ) -> Vocabulary:
        """The ``max_size`` most frequent tokens (ties broken alphabetically, so the result
        does not depend on corpus order) seen at least ``min_count`` times."""
        counts: Counter[str] = Counter()
        for sentence in sentences:
            counts.update(sentence)
        ranked = sorted((w for w, n in counts.items() if n >= min_count and w not in SPECIALS),
                        key=lambda w: (-counts[w], w))
        return cls(ranked[:max_size])

    def save(self, path: str | Path) -> None:
        Path(path).write_text("".join(w + "\n" for w in self.words), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        path = Path(path)
        if not path.is_file():
            raise ElmoUserError(f"vocabulary file not found: {path}")
        words = [w for w in path.read_text(encoding="utf-8").split("\n") if w]
        missing = [s for s in SPECIALS if s not in words]
        if missing:
            raise ElmoUserError(f"{path}: vocabulary lacks the special token {missing[0]}")
        return cls(w for w in words if w not in SPECIALS)
