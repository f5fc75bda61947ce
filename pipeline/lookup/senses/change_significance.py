"""Is a word's change more than chance, with many words tested at once: permutation
p-values with enough shuffles for the number of words ranked, and Benjamini-Hochberg
q-values across the words.

A p-value from ``R`` shuffles cannot go below ``1 / (R + 1)``: with 200 shuffles every
clearly changed word shows 0.005, and with 1,500 words ranked no such p survives a
false-discovery-rate correction (the best word needs p <= 0.05 / 1500). So the shuffles
adapt: every word gets ``resamples`` of them, and a word that fewer than ``MIN_EXCEEDING``
shuffles reach gets more, in rounds ten times larger, up to ``max_shuffles(words)``,
whose floor is below the smallest threshold BH can need for that many words. A word that
no shuffle reaches by then has p at that floor (reported as it is: a bound, not an
estimate). Cost: most words stop at ``resamples``; only the clearly changed ones pay for
more, a few thousand shuffles each, through the blocks' Gram matrix (``change_scores``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

# Shuffles reaching the observed score before a p-value is trusted as it is (below
# this, the estimate's relative error is over 30%, and more shuffles are drawn).
MIN_EXCEEDING = 10
GROWTH = 10  # each round draws this many times the shuffles drawn so far
MAX_SHUFFLES = 20_000  # per word, whatever the number of words (bounds the time)
SHUFFLE_CHUNK = 2_000  # shuffles scored together (memory: chunk x groups x blocks)
DEFAULT_MAX_Q = 0.05  # a change is significant at this false discovery rate


def max_shuffles(words: int, resamples: int, level: float = DEFAULT_MAX_Q) -> int:
    """Shuffles a word may get: enough that p's floor ``1 / (R + 1)`` is half the
    smallest BH threshold for ``words`` words (``level / words``), capped."""
    return max(resamples, min(MAX_SHUFFLES, math.ceil(2 * words / level)))


def permutation_p(exceeding: int, shuffles: int) -> float:
    """The share of shuffles scoring at least as high, +1 smoothed (never 0)."""
    return (1 + exceeding) / (1 + shuffles)


def bh_qvalues(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q) of ``p`` (NaN stays NaN and is not
    counted among the tests): ``q_(i) = min_{j >= i} m p_(j) / j``, capped at 1."""
    p = np.asarray(p, np.float64)
    q = np.full(p.shape, np.nan)
    tested = np.flatnonzero(np.isfinite(p))
    m = len(tested)
    if m == 0:
        return q
    order = tested[np.argsort(p[tested], kind="stable")]
    scaled = p[order] * m / np.arange(1, m + 1)
    q[order] = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    return q


def refined_p(draw: Callable[[int], np.ndarray], observed: float, null: np.ndarray,
              most: int) -> tuple[float, int]:
    """``(p, shuffles)``: a permutation p-value of ``observed`` from the shuffled scores
    ``null`` already drawn, with more drawn (``draw(n)``: ``n`` more shuffled scores; rounds
    ``GROWTH`` times larger, up to ``most`` in all) while fewer than ``MIN_EXCEEDING`` of
    them reach ``observed``."""
    finite = null[np.isfinite(null)]
    exceeding, counted, drawn = int((finite >= observed).sum()), len(finite), len(null)
    if not math.isfinite(observed):
        return math.nan, drawn
    while exceeding < MIN_EXCEEDING and drawn < most:
        target = min(most, drawn * GROWTH)
        while drawn < target and exceeding < MIN_EXCEEDING:
            n = min(SHUFFLE_CHUNK, target - drawn)
            more = draw(n)
            more = more[np.isfinite(more)]
            exceeding += int((more >= observed).sum())
            counted += len(more)
            drawn += n
    return (permutation_p(exceeding, counted) if counted else math.nan), drawn
