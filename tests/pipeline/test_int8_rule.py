"""The int8 rule is written once (schemas/layers.py) and every fast variant gives the
numpy reference's bytes, bit for bit, on the same hard cases: the compiled row loop (as
values and as dictionary indices), the halves kernels a CPU biLM quantizes its packed
layers with (with and without a residual added as they are read), the torch variant,
and DuckDB's dequantizing SQL against ``dequantize_int8``."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import torch

from elmo_model.quantize import quantize_int8_torch
from schemas import quantize_kernels
from schemas.layers import (
    INDEX_OFFSET,
    INT8_LIMIT,
    dequantize_int8,
    dequantize_int8_sql,
    int8_as_indices,
    quantize_int8,
    quantize_int8_indices,
    quantize_int8_into,
)


def hard_rows(dim: int = 64) -> np.ndarray:
    """float32 ``[n, dim]``: random rows at many magnitudes, heavy tails, ties of the
    rounding, the zero row (and -0.0), subnormals, values at the clip, near float32 max."""
    gen = np.random.default_rng(47)
    rows = [gen.standard_normal((8, dim)) * m for m in (1e-30, 1e-3, 1.0, 37.0, 1e30)]
    rows.append(gen.standard_normal((8, dim)) ** 3)
    special = np.zeros((9, dim))
    special[1] = -0.0
    special[2, 3] = 1e-40
    special[3, 0] = -1e-45
    special[4] = np.linspace(-3.4e38, 3.4e38, dim)
    special[5] = -7.25
    special[6, ::2], special[6, 1::2] = 1.0, -1.0
    special[7, : dim // 2] = np.arange(dim // 2) - dim // 4 + 0.5  # ties
    special[7, -1] = INT8_LIMIT  # absmax 127: scale exactly 1
    special[8] = np.arange(dim) * 2 - dim + 1  # odd integers over scale 2: ties
    special[8, 0] = 2 * INT8_LIMIT
    out = np.concatenate([*rows, special]).astype(np.float32)
    assert np.isfinite(out).all()
    return out


def assert_same(values: np.ndarray, scales: np.ndarray, ref: tuple[np.ndarray, np.ndarray]
                ) -> None:
    assert values.dtype == np.int8 and np.array_equal(values, ref[0])
    assert scales.dtype == np.float32 and scales.tobytes() == ref[1].tobytes()


def test_the_reference_states_the_rule() -> None:
    q, scale = quantize_int8(np.array([[0.5, 1.5, 2.5, -0.5, -1.5, 127.0], [0, 0, 0, 0, 0, -0.0],
                                       [254, 3, -3, 1, 0, 0]], np.float32))
    assert q.tolist() == [[0, 2, 2, 0, -2, 127], [0] * 6, [127, 2, -2, 0, 0, 0]]
    assert scale.tolist() == [1.0, 0.0, 2.0] and not np.signbit(scale).any()
    assert INDEX_OFFSET == INT8_LIMIT == 127


@pytest.mark.parametrize("dim", [64, 7])
def test_the_compiled_row_loop_is_the_reference(dim: int) -> None:
    x = hard_rows(dim)
    ref = quantize_int8(x)
    assert_same(*quantize_int8_into(x), ref)
    values, scales = np.empty_like(ref[0]), np.empty_like(ref[1])
    quantize_int8_into(x, values, scales)
    assert_same(values, scales, ref)
    indices, index_scales = quantize_int8_indices(x)
    assert indices.dtype == np.uint8 and np.array_equal(indices, int8_as_indices(ref[0]))
    assert index_scales.tobytes() == ref[1].tobytes()
    assert np.array_equal(indices.astype(np.int16) - INDEX_OFFSET, ref[0])


def test_the_halves_kernels_are_the_reference_on_the_whole_vectors() -> None:
    """A vector given as halves lying in two arrays, rows picked and placed anywhere (a
    biLM layer's forward and backward outputs in packed order), and the same with a
    residual added to each half as it is read."""
    x = hard_rows(64)
    n = len(x)
    gen = np.random.default_rng(3)
    first_rows, second_rows, out_rows = (gen.permutation(n) for _ in range(3))
    first = np.empty((n, 32), np.float32)
    second = np.empty((n, 32), np.float32)
    first[first_rows], second[second_rows] = x[:, :32], x[:, 32:]
    values, scales = np.empty((n, 64), np.int8), np.empty(n, np.float32)
    quantize_kernels.quantize_halves(first, second, first_rows, second_rows, values, scales,
                                     out_rows)
    ref_q, ref_scale = quantize_int8(x)
    assert_same(values[out_rows], scales[out_rows], (ref_q, ref_scale))

    # residuals that shrink each value by up to half: no sum overflows near float32's max
    add = (x * gen.uniform(-0.5, 0, x.shape)).astype(np.float32)
    add_first, add_second = np.empty_like(first), np.empty_like(second)
    add_first[first_rows], add_second[second_rows] = add[:, :32], add[:, 32:]
    quantize_kernels.quantize_summed_halves(first, second, add_first, add_second, first_rows,
                                            second_rows, values, scales, out_rows)
    assert_same(values[out_rows], scales[out_rows], quantize_int8(x + add))


def test_the_torch_variant_is_the_reference() -> None:
    x = hard_rows(64)
    values, scales = quantize_int8_torch(torch.from_numpy(x))
    assert_same(values.numpy(), scales.numpy(), quantize_int8(x))


def test_the_sql_dequantization_is_dequantize_int8() -> None:
    q, scale = quantize_int8(hard_rows(16)[:48])  # finite products in float32
    table = pa.table({"v": pa.FixedSizeListArray.from_arrays(pa.array(q.reshape(-1)), 16),
                      "v_scale": pa.array(scale, pa.float32())})
    con = duckdb.connect()
    con.register("t", table)
    got = con.sql(f"SELECT {dequantize_int8_sql('v', 'v_scale')} AS x FROM t").fetchall()
    widened = np.array([row[0] for row in got], np.float32)  # float32s, exact as Python floats
    assert widened.tobytes() == dequantize_int8(q, scale).tobytes()
