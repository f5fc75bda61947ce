"""``unit_vectors``: the one unit-length scaling of the read path."""

from __future__ import annotations

import numpy as np

from pipeline.lookup.layers.vectors import unit_vectors


def test_rows_and_single_vectors_get_unit_length() -> None:
    rows = np.array([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0]], np.float16)
    unit = unit_vectors(rows)
    assert unit.dtype == np.float32 and unit.flags.c_contiguous and unit.shape == (3, 2)
    np.testing.assert_allclose(unit, [[0.6, 0.8], [0.0, 0.0], [1.0, 0.0]], rtol=1e-3)
    np.testing.assert_allclose(unit_vectors(np.array([0.0, 2.0])), [0.0, 1.0])
    cosine = unit_vectors(np.array([1.0, 1.0])) @ unit_vectors(np.array([1.0, 0.0]))
    assert abs(cosine - np.sqrt(0.5)) < 1e-6
