"""The exact cosine every compact-index ranking ends with (``MemoryIvf.cosines``): int8
rows, in blocks or not, and float16 rows alike give each row's cosine to the query."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.lookup.index.ivf_search import RANK_BLOCK_ROWS, MemoryIvf


def _ivf_over(vectors: np.ndarray) -> MemoryIvf:
    ivf = MemoryIvf.__new__(MemoryIvf)  # only the vectors matter to cosines
    ivf.vectors = vectors
    return ivf


@pytest.mark.parametrize("dtype", ["int8", "float16"])
def test_cosines_over_more_rows_than_a_block(dtype: str) -> None:
    rng = np.random.default_rng(7)
    rows = RANK_BLOCK_ROWS + 300
    if dtype == "int8":
        vectors = rng.integers(-127, 128, (rows, 48), dtype=np.int8)
    else:
        vectors = rng.standard_normal((rows, 48)).astype(np.float16)
    vectors[5] = 0  # a zero row: cosine 0, not NaN
    query = rng.standard_normal(48).astype(np.float32)
    query /= np.linalg.norm(query)
    positions = np.sort(rng.choice(rows, RANK_BLOCK_ROWS + 100, replace=False))
    positions[0] = 5
    wide = vectors[positions].astype(np.float64)
    want = wide @ query / np.maximum(np.linalg.norm(wide, axis=1), 1e-12)
    got = _ivf_over(vectors).cosines(query, positions)
    assert got.dtype == np.float32 and got.shape == (len(positions),)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert got[0] == 0
    few = _ivf_over(vectors).cosines(query, positions[:10])  # a query's candidates
    np.testing.assert_allclose(few, want[:10], atol=1e-5)
