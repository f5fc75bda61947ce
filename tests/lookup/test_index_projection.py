"""The projection a compact index's codes are made in (``projection``): which directions it
keeps, that it keeps inner products, and that it is what makes product codes rank rows
whose energy lies in few directions: the failure of issue 46 (PQ codes of 1024 raw values
ranked too roughly for 240 candidates a result to hold the exact neighbours)."""

from __future__ import annotations

import faiss
import numpy as np

from pipeline.lookup.index.ivf_shards_build import codes_for
from pipeline.lookup.index.projection import (
    DIM_STEP,
    ENERGY_KEPT,
    inverted,
    kept_directions,
    principal_projection,
    random_rotation,
    with_projection,
)


def _low_rank_rows(n: int, dim: int, rank: int, seed: int = 0) -> np.ndarray:
    """Unit rows of ``dim`` values whose energy lies in ``rank`` directions (plus a shared
    direction and a little noise): contextual vectors' shape."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((dim, rank + 1)))[0].T  # [rank + 1, dim]
    weights = rng.standard_normal((n, rank + 1)) * np.linspace(1.0, 0.2, rank + 1)
    weights[:, 0] = 3.0  # the direction every row shares
    rows = weights @ basis + 0.002 * rng.standard_normal((n, dim))
    rows = rows.astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _second_moment(rows: np.ndarray) -> np.ndarray:
    return rows.T @ rows / len(rows)


def test_keeps_the_fewest_steps_of_directions_that_hold_the_energy() -> None:
    energy = np.array([50.0, 30.0, 19.0] + [0.004] * 125)  # 128 directions
    assert np.sum(energy[:3]) / np.sum(energy) < ENERGY_KEPT <= np.sum(energy[:4]) / np.sum(
        energy)
    assert kept_directions(energy) == DIM_STEP  # 4, rounded up to a step
    assert kept_directions(np.array([1.0] * 70 + [1e-6] * 58)) == 2 * DIM_STEP
    flat = np.ones(4 * DIM_STEP)
    assert kept_directions(flat) == 4 * DIM_STEP  # spread evenly: every direction
    assert kept_directions(np.ones(DIM_STEP + 8)) == DIM_STEP + 8  # not a whole step
    assert kept_directions(np.zeros(2 * DIM_STEP)) == 2 * DIM_STEP


def test_projection_is_orthonormal_and_keeps_inner_products() -> None:
    rows = _low_rank_rows(3_000, 4 * DIM_STEP, 20)
    projection = principal_projection(_second_moment(rows))
    assert projection.shape == (4 * DIM_STEP, DIM_STEP) and projection.dtype == np.float32
    assert np.allclose(projection.T @ projection, np.eye(DIM_STEP), atol=1e-5)
    rotation = random_rotation(16)
    assert np.allclose(rotation @ rotation.T, np.eye(16), atol=1e-12)
    assert np.array_equal(rotation, random_rotation(16))  # a fixed seed: builds repeat
    a, b = rows[:100], rows[100:200]
    exact = np.sum(a * b, axis=1)
    projected = np.sum((a @ projection) * (b @ projection), axis=1)
    assert np.max(np.abs(projected - exact)) < 2e-3  # what is left out: the noise


def test_projected_product_codes_rank_low_rank_rows_near_exactly() -> None:
    """The same lists, probes and candidates with and without the projection: candidates
    taken by the codes, re-ranked exactly, hold many more of the exact neighbours with it,
    at half the code bytes."""
    dim, n = 1024, 12_000
    every = _low_rank_rows(n + 50, dim, 24, seed=1)
    rows, queries = every[:n], every[n:]  # new rows in the same directions
    truth = np.argsort(-(queries @ rows.T), axis=1)[:, :10]
    train = rows[:6_000]

    def recall(index: faiss.Index) -> float:
        index.add(rows)
        inverted(index).nprobe = 32  # every list: the codes' order alone differs
        hits = []
        for q, want in zip(queries, truth, strict=True):
            _, found = index.search(q[None], 100)  # 10 candidates a result
            found = found[0][found[0] >= 0]
            best = found[np.argsort(-(rows[found] @ q))[:10]]
            hits.append(len(set(best.tolist()) & set(want.tolist())) / 10)
        return float(np.mean(hits))

    # 4-bit codes keep the test quick; the 8-bit ones of a build differ the same way.
    plain = faiss.index_factory(dim, "IVF32,PQ64x4", faiss.METRIC_INNER_PRODUCT)
    plain.train(train)
    projection = principal_projection(_second_moment(train))
    kept = projection.shape[1]
    assert kept == DIM_STEP and codes_for(n, kept) == "PQ32"
    inner = faiss.index_factory(kept, "IVF32,PQ32x4", faiss.METRIC_INNER_PRODUCT)
    inner.train(train @ projection)
    with_it, without = recall(with_projection(projection, inner)), recall(plain)
    assert with_it >= 0.95 and with_it > without + 0.1, (with_it, without)
