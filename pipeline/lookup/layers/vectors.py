"""Vectors scaled to unit length: the one definition the index, the senses and the server
use for cosine geometry (a dot product of unit vectors is their cosine)."""

from __future__ import annotations

import numpy as np

# A norm below this counts as zero: the vector stays zero instead of dividing by zero.
MIN_NORM = 1e-12


def unit_vectors(vectors: np.ndarray) -> np.ndarray:
    """``vectors`` (one vector, or one a row; any float type) scaled to unit length, as a
    contiguous float32 array of the same shape."""
    vectors = np.asarray(vectors, np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.ascontiguousarray(vectors / np.maximum(norms, MIN_NORM))
