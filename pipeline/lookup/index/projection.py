"""The space a compact index's codes are made in: its rows' principal directions, turned.

Contextual vectors fill few of their dimensions. At 3 x 1024 (the near-free wide model on
2.1M tokens) 64 directions hold 99.6% of the rows' energy; product codes of 16 raw values a
code byte ranked candidates so roughly that 240 a result had to be re-ranked to keep 0.97
of the exact neighbours. Coded in the fewest principal directions holding ``ENERGY_KEPT``
of the energy, turned by a random rotation so that each sub-quantizer gets a like share of
it, at ``VALUES_PER_CODE_BYTE`` values a byte, 20 candidates a result kept 0.996 with half
the code bytes (BENCHMARKS.md, "issue 46: codes in the rows' principal directions").

The projection is ``P = V[:, :kept] @ R``: ``V`` the eigenvectors of the sample's
uncentred second moment ``X^T X / n``, strongest first (uncentred, so that the direction
all rows share is kept: inner products, not distances to a mean, rank the rows), ``R`` a
``kept x kept`` orthogonal matrix drawn from a fixed seed. An inner product ``q . x``
becomes ``(qP) . (xP)``, exact but for the energy left out. The candidates are re-ranked
by the stored vectors' exact cosine, so what is left out costs only candidate order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# Share of the sample's energy (sum of squares) the kept directions hold.
ENERGY_KEPT = 0.995
# Kept directions come in steps of this many (a whole number of sub-quantizers).
DIM_STEP = 64
# Values a byte of product code: 2 kept 0.996 of the exact 10 at 20 candidates a result,
# 4 0.87 (2.1M x 1024, 64 and 128 directions; BENCHMARKS.md).
VALUES_PER_CODE_BYTE = 2


def kept_directions(energy: np.ndarray) -> int:
    """How many of the principal directions (``energy``: their eigenvalues, strongest
    first) a projection keeps: the fewest holding ``ENERGY_KEPT``, rounded up to a step of
    ``DIM_STEP``; every direction where the width is not a multiple of the step."""
    import numpy as np

    dim = len(energy)
    total = float(np.sum(energy))
    if dim % DIM_STEP or total <= 0:
        return dim
    share = np.cumsum(energy) / total
    enough = int(np.searchsorted(share, ENERGY_KEPT)) + 1
    return min(dim, -(-enough // DIM_STEP) * DIM_STEP)


def principal_projection(second: np.ndarray, kept: int | None = None) -> np.ndarray:
    """``[dim, kept]`` float32: the ``kept`` (default: as many as ``kept_directions``
    keeps) strongest principal directions of rows whose second moment is ``second``
    (``X^T X / n``, ``[dim, dim]``), turned by a fixed random rotation."""
    import numpy as np

    energy, directions = np.linalg.eigh(np.asarray(second, np.float64))
    order = np.argsort(-energy, kind="stable")
    kept = kept or kept_directions(np.maximum(energy[order], 0.0))
    return (directions[:, order[:kept]] @ random_rotation(kept)).astype(np.float32)


def random_rotation(n: int) -> np.ndarray:
    """An ``n x n`` orthogonal matrix drawn from a fixed seed (Haar: the QR of a Gaussian
    matrix, its signs fixed by ``R``'s diagonal)."""
    import numpy as np

    q, r = np.linalg.qr(np.random.default_rng(0).standard_normal((n, n)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def with_projection(projection: np.ndarray, index: Any) -> Any:
    """``index`` (trained on projected rows) behind the projection, as one faiss index:
    it projects what it adds, encodes and searches, and is stored with it."""
    import faiss
    import numpy as np

    dim, kept = projection.shape
    transform = faiss.LinearTransform(dim, kept, False)
    faiss.copy_array_to_vector(np.ascontiguousarray(projection.T, np.float32).ravel(),
                               transform.A)
    transform.is_trained = True
    return faiss.IndexPreTransform(transform, index)


def inverted(index: Any) -> Any:
    """The IVF of ``index`` (itself, or the one behind its projection), downcast: its
    lists, codes and probes."""
    import faiss

    return faiss.downcast_index(faiss.extract_index_ivf(index))
