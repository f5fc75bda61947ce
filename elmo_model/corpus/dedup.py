"""Near-duplicate paragraphs out, first occurrence kept.

Two passes over each paragraph, in the order the sources are read (so reruns keep the same
copies): an exact match on a normalized form (case, punctuation and spacing ignored) drops
verbatim and trivially-edited copies cheaply; then MinHash locality-sensitive hashing over
word 3-gram shingles (datasketch) finds earlier paragraphs that may overlap, and the
paragraph is dropped when its shingles' Jaccard similarity to one of them is
:data:`NEAR_DUPLICATE_JACCARD` or more (boilerplate notes repeated across
pages with a name changed, the same lead in two articles, a verse repeated with one word
changed). Paragraphs are short, so the shingles are short too: one word changed in a
30-word paragraph changes 3 of its 28 trigrams (Jaccard 0.81), where 5-grams would drop it
to 0.68.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from datasketch import MinHash, MinHashLSH

NEAR_DUPLICATE_JACCARD = 0.7
SHINGLE_WORDS = 3
NUM_PERM = 128
# A paragraph with fewer shingles than this is only checked for exact copies: a short
# paragraph's Jaccard estimate swings with a single word.
MIN_SHINGLES_FOR_NEAR = 3
NEAR_EXAMPLES_PER_SOURCE = 50
_WORD_RE = re.compile(r"\w+")


def normalize(paragraph: str) -> list[str]:
    """The paragraph's lowercased words, punctuation and spacing dropped."""
    return _WORD_RE.findall(paragraph.lower())


def shingles(words: list[str]) -> set[bytes]:
    if len(words) <= SHINGLE_WORDS:
        return {" ".join(words).encode("utf-8")}
    return {" ".join(words[i:i + SHINGLE_WORDS]).encode("utf-8")
            for i in range(len(words) - SHINGLE_WORDS + 1)}


def jaccard(a: set[bytes], b: set[bytes]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


@dataclass
class DedupCounts:
    exact: int = 0
    near: int = 0
    kept: int = 0


@dataclass
class ParagraphDeduper:
    """Remembers every kept paragraph; :meth:`keep` says whether a new one is new."""

    threshold: float = NEAR_DUPLICATE_JACCARD
    counts: dict[str, DedupCounts] = field(default_factory=dict)
    # source -> (dropped paragraph, the kept paragraph it matched), the first few of each
    near_examples: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._seen: set[bytes] = set()
        self._lsh = MinHashLSH(threshold=self.threshold, num_perm=NUM_PERM)
        # MinHash draws its permutations on every construction unless given them: once here.
        template = MinHash(num_perm=NUM_PERM, seed=1)
        self._permutations, self._scheme = template.permutations, template.scheme
        self._kept_text: dict[str, str] = {}

    def keep(self, source: str, paragraph: str) -> bool:
        counts = self.counts.setdefault(source, DedupCounts())
        words = normalize(paragraph)
        digest = hashlib.blake2b(" ".join(words).encode("utf-8"), digest_size=16).digest()
        if digest in self._seen:
            counts.exact += 1
            return False
        self._seen.add(digest)
        pieces = shingles(words)
        if len(pieces) >= MIN_SHINGLES_FOR_NEAR:
            signature = MinHash(num_perm=NUM_PERM, seed=1, permutations=self._permutations,
                                scheme=self._scheme)
            signature.update_batch(list(pieces))
            # LSH only proposes candidates (a third of them fell below the threshold on
            # the real corpus): the exact Jaccard of the shingles decides.
            match = next((key for key in sorted(self._lsh.query(signature))
                          if jaccard(pieces, shingles(normalize(self._kept_text[key])))
                          >= self.threshold), None)
            if match is not None:
                counts.near += 1
                examples = self.near_examples.setdefault(source, [])
                if len(examples) < NEAR_EXAMPLES_PER_SOURCE:
                    examples.append((paragraph, self._kept_text[match]))
                return False
            key = digest.hex()
            self._lsh.insert(key, signature)
            self._kept_text[key] = paragraph
        counts.kept += 1
        return True
