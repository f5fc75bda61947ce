"""Pooling token vectors into one vector per group (a sentence or a document), the one
rule that both the stored tables and a query's vector follow.

A pool is computed from running statistics of each group's tokens (their sum, the sum of
their unit-length vectors, their element-wise maximum, their count), so that a group's
tokens may arrive in several batches: ``GroupStats.add`` takes one batch whose rows are
in group order (as a tokens file stores them), ``GroupStats.merged`` combines what came in
for each group, and ``finish`` turns the statistics into the pooled vectors:

- ``mean``: the average token vector (Spark NLP's ``SentenceEmbeddings`` AVERAGE,
  simple_elmo's ``get_elmo_vector_average``);
- ``unit_mean``: the average of the tokens' unit-length vectors (each token counts the
  same, whatever its norm);
- ``max``: the element-wise maximum (max-pooling);
- ``mean_max``: ``mean`` and ``max`` side by side (twice the width).

Sums are kept in float64 and the result is float32.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from elmo_model.errors import ElmoUserError

METHODS = ("mean", "unit_mean", "max", "mean_max")
BY = ("sentence", "document")
# Chosen by bench/pooled_features.py (BENCHMARKS.md, "issue 49"): on the four-book corpus
# the best same-document and same-book retrieval of the ELMo features, and probe accuracy
# within noise of the best; layer 0, max and mean_max were clearly worse.
DEFAULT_METHOD = "unit_mean"
DEFAULT_MIX = "average"

_NORM_EPS = 1e-12


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ElmoUserError(f"pooling method must be one of {', '.join(METHODS)}, not "
                            f"{method!r}")
    return method


def check_by(by: str) -> str:
    if by not in BY:
        raise ElmoUserError(f"by must be sentence or document, not {by!r}")
    return by


def pooled_width(dim: int, method: str) -> int:
    return 2 * dim if method == "mean_max" else dim


def _needs(method: str) -> tuple[bool, bool, bool]:
    """Which statistics ``method`` uses: (sum, unit sum, max)."""
    return (method in ("mean", "mean_max"), method == "unit_mean",
            method in ("max", "mean_max"))


def run_starts(*keys: np.ndarray) -> np.ndarray:
    """Indices where a run of equal keys starts (rows in group order), 0 first."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, np.int64)
    changed = np.zeros(n, bool)
    changed[0] = True
    for key in keys:
        changed[1:] |= key[1:] != key[:-1]
    return np.flatnonzero(changed)


@dataclass
class GroupStats:
    """Per-group running statistics for one pooling ``method`` over ``dim``-wide vectors."""

    method: str
    dim: int
    keys: list[Hashable] = field(default_factory=list)
    counts: list[np.ndarray] = field(default_factory=list)
    sums: list[np.ndarray] = field(default_factory=list)
    unit_sums: list[np.ndarray] = field(default_factory=list)
    maxes: list[np.ndarray] = field(default_factory=list)

    def add(self, vectors: np.ndarray, starts: np.ndarray, keys: Sequence[Hashable]) -> None:
        """One batch: ``vectors`` [n, dim] in group order, ``starts`` its runs' first rows
        (``run_starts``), ``keys`` each run's group key."""
        if len(vectors) == 0:
            return
        use_sum, use_unit, use_max = _needs(self.method)
        self.keys.extend(keys)
        self.counts.append(np.diff(np.append(starts, len(vectors))))
        if use_sum:
            self.sums.append(np.add.reduceat(vectors, starts, axis=0, dtype=np.float64))
        if use_unit:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            unit = vectors / np.maximum(norms, _NORM_EPS)
            self.unit_sums.append(np.add.reduceat(unit, starts, axis=0, dtype=np.float64))
        if use_max:
            self.maxes.append(np.maximum.reduceat(vectors, starts, axis=0))

    def merged(self) -> tuple[list[Hashable], np.ndarray, np.ndarray]:
        """Each distinct key (in order of first appearance), its number of tokens and its
        pooled vector."""
        if not self.keys:
            return [], np.zeros(0, np.int64), np.zeros(
                (0, pooled_width(self.dim, self.method)), np.float32)
        order: dict[Hashable, int] = {}
        slot = np.array([order.setdefault(key, len(order)) for key in self.keys], np.int64)
        groups = len(order)

        def combined(parts: list[np.ndarray], ufunc: np.ufunc, start: float) -> np.ndarray:
            joined = np.concatenate(parts)
            if groups == len(joined):  # no group split across batches: nothing to merge
                out = np.empty_like(joined)
                out[slot] = joined
                return out
            out = np.full((groups, joined.shape[1]), start, joined.dtype)
            ufunc.at(out, slot, joined)
            return out

        counts = combined([c[:, None].astype(np.float64) for c in self.counts], np.add,
                          0.0)[:, 0]
        return list(order), counts.astype(np.int64), finish(
            self.method, counts,
            combined(self.sums, np.add, 0.0) if self.sums else None,
            combined(self.unit_sums, np.add, 0.0) if self.unit_sums else None,
            combined(self.maxes, np.maximum, -np.inf) if self.maxes else None)


def finish(method: str, counts: np.ndarray, sums: np.ndarray | None,
           unit_sums: np.ndarray | None, maxes: np.ndarray | None) -> np.ndarray:
    """The pooled float32 vectors from a group's statistics."""
    per = np.maximum(counts, 1)[:, None]
    if method == "mean":
        out = sums / per  # type: ignore[operator]
    elif method == "unit_mean":
        out = unit_sums / per  # type: ignore[operator]
    elif method == "max":
        out = maxes
    else:
        out = np.concatenate([sums / per, maxes], axis=1)  # type: ignore[operator,list-item]
    return np.ascontiguousarray(out, np.float32)


def pool_vectors(vectors: np.ndarray, method: str) -> np.ndarray:
    """One group's pooled vector: the rule above for rows that are all one group (a
    query's tokens)."""
    stats = GroupStats(check_method(method), vectors.shape[1])
    stats.add(np.asarray(vectors, np.float32), np.zeros(1, np.int64), [0])
    return stats.merged()[2][0]
