"""Exact sense search in this process, for words with few rows.

A word's rows (in any of its forms, or as written) are read from the index once, with
their vectors scaled to unit length, and kept (least recently used dropped past
``EXACT_CACHE_VALUES``); a query is then one matrix-vector product over them. The
answer is the index's exact search's: cosine similarity to every candidate, nearest
first, repeated contexts once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from pipeline.lookup.index.sense_index import RESULT_COLUMNS, SenseIndex
from pipeline.lookup.layers.tokens import matrix
from pipeline.lookup.layers.vectors import unit_vectors
from pipeline.lookup.senses.hits import Hit, ranked_distinct
from pipeline.lookup.serve.limits import EXACT_CACHE_VALUES, EXACT_CANDIDATE_VALUES


@dataclass
class Candidates:
    rows: list[dict[str, Any]]  # RESULT_COLUMNS of each row
    unit: np.ndarray  # [n, dim] float32, rows scaled to length 1

    @property
    def values(self) -> int:
        return int(self.unit.size)


# The index columns a Hit is made of (its document fields come from the served store).
HIT_COLUMNS = [c for c in RESULT_COLUMNS if c in {f.name for f in fields(Hit)}]

class ExactSearch:
    def __init__(self, max_values: int = EXACT_CANDIDATE_VALUES,
                 cache_values: int = EXACT_CACHE_VALUES) -> None:
        self.max_values, self.cache_values = max_values, cache_values
        self.cache: OrderedDict[tuple[Any, ...], Candidates] = OrderedDict()
        self.held = 0
        self.lock = threading.Lock()
        self.small: dict[tuple[Any, ...], bool] = {}

    def takes(self, index: SenseIndex, words: tuple[str, ...] | None, forms: bool) -> bool:
        """Whether this search is small enough to run here."""
        if words is None:
            return False
        key = (id(index), words, forms)
        if key not in self.small:  # the index does not change while it is served
            column = "token_stem" if forms else "token_lower"
            self.small[key] = index.word_rows(words, column) * index.meta.dim <= self.max_values
        return self.small[key]

    def candidates(self, index: SenseIndex, words: tuple[str, ...], forms: bool) -> Candidates:
        key = (id(index), words, forms)
        with self.lock:
            if key in self.cache:
                self.cache.move_to_end(key)
                return self.cache[key]
        column = "token_stem" if forms else "token_lower"
        table = index.occurrences(words, columns=HIT_COLUMNS, limit=max(1, index.meta.rows),
                                  column=column)
        vectors = unit_vectors(matrix(table.column("vector")))
        rows = table.drop_columns(["vector"]).to_pylist()
        found = Candidates(rows, vectors)
        with self.lock:
            if key not in self.cache:
                self.cache[key] = found
                self.held += found.values
                while self.held > self.cache_values and len(self.cache) > 1:
                    _, dropped = self.cache.popitem(last=False)
                    self.held -= dropped.values
        return found

    def nearest(self, index: SenseIndex, words: tuple[str, ...], forms: bool,
                vector: np.ndarray, k: int) -> list[Hit]:
        """The ``k`` nearest candidates, a context once (its nearest use)."""
        found = self.candidates(index, words, forms)
        similarity = found.unit @ unit_vectors(vector)
        # Hits made lazily, nearest first, until k distinct ones are found.
        return ranked_distinct((Hit(rank=0, similarity=float(similarity[i]), **found.rows[i])
                                for i in np.argsort(-similarity, kind="stable").tolist()), k)
