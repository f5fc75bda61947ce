"""The sense index's fast search path returns what LanceDB's plain sync query returns.

A real IVF_HNSW_SQ index over a small synthetic dataset in the stored layout (written by
bench/lookup.py's generator, built by ``build_index``): every kind of search
``SenseIndex.vector_query`` can describe (graph or exact, with or without a prefilter, one
query vector or several) gives the same rows and distances through ``VectorSearch.to_arrow``
as through ``VectorSearch.lancedb_query``, the query the index ran before.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from synthetic_dataset import write_synthetic

from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.lance_search import VectorSearch
from pipeline.lookup.index.meta import SearchParams
from pipeline.lookup.index.sense_index import SenseIndex, token_filter

KEYS = ("doc_id", "sent_idx", "tok_idx")
DIM = 32


def _write_synthetic(out: Path, n_tokens: int) -> None:
    write_synthetic(out, n_tokens, DIM, n_shards=2, vocab=200)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> SenseIndex:
    root = tmp_path_factory.mktemp("index_search")
    _write_synthetic(root / "ds", 6000)
    build_index(str(root / "ds"), "top", str(root / "ix"), kind="hnsw", compact=False)
    return SenseIndex(str(root / "ix"))


def _queries(n: int) -> np.ndarray:
    return np.random.default_rng(3).standard_normal((n, DIM)).astype(np.float32)


def _assert_same(fast: pa.Table, plain: pa.Table) -> None:
    assert fast.schema == plain.schema
    assert fast.num_rows == plain.num_rows > 0
    # Same rows in the same order, and bit-identical distances.
    assert fast.equals(plain), (fast.slice(0, 3).to_pydict(), plain.slice(0, 3).to_pydict())


@pytest.mark.slow
@pytest.mark.parametrize("n_vectors", [1, 5])
@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("prefilter", [False, True])
def test_fast_path_equals_plain_lancedb_query(index: SenseIndex, n_vectors: int, graph: bool,
                                              prefilter: bool) -> None:
    assert index.meta.built == "hnsw"
    where = token_filter(["w1", "w2", "w7"]) if prefilter else None
    settings = index.meta.search if graph else None
    search = VectorSearch(index.table, _queries(n_vectors), 10, KEYS, where, settings)
    fast = search.to_arrow()
    _assert_same(fast, search.lancedb_query().to_arrow())
    if n_vectors > 1:
        per_query = np.bincount(fast["query_index"].to_numpy(), minlength=n_vectors)
    else:
        assert "query_index" not in fast.column_names
        per_query = np.array([fast.num_rows])
    if graph and prefilter:
        # LanceDB's graph search under a prefilter may stop short of k when the filter keeps
        # few rows (so SenseIndex sends such searches to the exact path); both paths must
        # still agree, and every query gets some rows and never more than k.
        assert ((per_query >= 1) & (per_query <= 10)).all(), per_query
    else:
        assert (per_query == 10).all(), per_query
    if prefilter:
        tokens = index.table.search().where(where).select(["token"]).to_arrow()
        assert set(tokens["token"].to_pylist()) <= {"w1", "w2", "w7"}


@pytest.mark.slow
def test_settings_reach_the_search(index: SenseIndex) -> None:
    """Whatever the graph settings, both paths give the same answer."""
    q = _queries(1)
    for settings in (SearchParams(1, 12, None), SearchParams(3, 40, 2), SearchParams(20, 150, 5)):
        search = VectorSearch(index.table, q, 10, KEYS, None, settings)
        _assert_same(search.to_arrow(), search.lancedb_query().to_arrow())


@pytest.mark.slow
def test_sense_index_search_uses_it(index: SenseIndex) -> None:
    """With its in-memory IVF set aside (tests/lookup/test_held_ivf.py covers that path),
    every search goes this way."""
    index.use_ivf = False
    try:
        _searches_use_it(index)
    finally:
        index.use_ivf = True


def _searches_use_it(index: SenseIndex) -> None:
    q = _queries(3)
    for words, exact in ((None, False), (None, True), (["w1"], False)):
        query = index.vector_query(q[:1], k=7, words=words, exact=exact, columns=KEYS)
        got = index.search(q[0], k=7, words=words, exact=exact, columns=KEYS)
        _assert_same(got, query.lancedb_query().to_arrow())
    many = index.vector_query(q, k=4, columns=KEYS)
    _assert_same(many.to_arrow(), many.lancedb_query().to_arrow())
    # The exact answer is the brute-force one.
    exact = index.search(q[0], k=5, exact=True, columns=KEYS)
    vectors = index.table.search().select([*KEYS, "vector"]).limit(100_000).to_arrow()
    matrix = np.stack(vectors["vector"].to_numpy(zero_copy_only=False))
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    best = np.argsort(-(unit @ (q[0] / np.linalg.norm(q[0]))))[:5]
    assert exact["tok_idx"].to_pylist() == vectors["tok_idx"].take(best).to_pylist()


@pytest.mark.slow
def test_runs_from_threads_and_inside_a_running_loop(index: SenseIndex) -> None:
    """Each thread runs the search on its own event loop; inside a running loop (where a
    second cannot run) it goes to LanceDB's background loop."""
    q = _queries(1)
    want = index.search(q[0], k=5, columns=KEYS)
    results: list[pa.Table] = []

    def worker() -> None:
        for _ in range(3):
            results.append(index.search(q[0], k=5, columns=KEYS))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 9 and all(r.equals(want) for r in results)

    async def inside() -> pa.Table:
        return index.search(q[0], k=5, columns=KEYS)

    assert asyncio.run(inside()).equals(want)
