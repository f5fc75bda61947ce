"""The direct int8 page decoder and the fused int8 mix against pyarrow and the reference.

int8 layers as the pipeline writes them (dictionary pages) and as other writers might
(few distinct values: narrow bit widths and long RLE runs; no dictionary; data page v2)
are decoded and compared bitwise with pyarrow; layouts the decoder does not handle must
raise ``UnsupportedLayoutError`` (then pyarrow reads them), never give wrong numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline.lookup.layers.mixes as mixes
from pipeline.lookup.layers.int8 import int8_columns, read_int8_values
from pipeline.lookup.layers.mixes import iter_mixed, mix_arrays
from pipeline.lookup.layers.parquet import CorruptPageError, UnsupportedLayoutError
from pipeline.lookup.layers.tokens import read_table
from schemas.dataset import open_dataset
from schemas.mix_specs import Mix

ROWS, DIM = 2000, 40


def _values(kind: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "wide":  # every int8 value: 8-bit indices
        x = rng.integers(-127, 128, size=(ROWS, DIM))
    elif kind == "narrow":  # 5 values: 3-bit indices, and runs of one value
        x = rng.integers(-2, 3, size=(ROWS, DIM))
        x[::3] = 0
    else:  # one value: bit width 0
        x = np.zeros((ROWS, DIM), np.int64)
    return x.astype(np.int8)


def _write(path: Path, x: np.ndarray, **options: object) -> None:
    column = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.int8()), DIM)
    pq.write_table(pa.table({"v": column}), path, write_page_checksum=True,
                   row_group_size=700, data_page_size=5000, **options)


def _decode(path: Path) -> np.ndarray:
    parquet = pq.ParquetFile(path)
    column = int8_columns(parquet.metadata, parquet.schema_arrow, ["v"])["v"]
    out = []
    with pa.OSFile(str(path)) as source:
        for g in range(parquet.metadata.num_row_groups):
            rows = parquet.metadata.row_group(g).num_rows
            values = np.empty(rows * DIM, np.int8)
            read_int8_values(source, parquet.metadata.row_group(g).column(0), rows, column,
                             values, None)
            out.append(values.reshape(rows, DIM))
    return np.concatenate(out)


@pytest.mark.parametrize("kind", ["wide", "narrow", "constant"])
@pytest.mark.parametrize("options", [{"compression": "zstd"}, {"compression": "snappy"},
                                     {"compression": "none"},
                                     {"compression": "zstd", "data_page_version": "2.0"}],
                         ids=["zstd", "snappy", "none", "v2"])
def test_int8_decoder_equals_pyarrow(tmp_path: Path, kind: str, options: dict) -> None:
    x = _values(kind)
    path = tmp_path / "t.parquet"
    _write(path, x, **options)
    want = pq.read_table(path).column("v").combine_chunks().flatten().to_numpy()
    assert np.array_equal(want.reshape(ROWS, DIM), x)
    assert np.array_equal(_decode(path), x)


def test_int8_decoder_declines_plain_pages_and_rejects_corrupt_ones(tmp_path: Path) -> None:
    plain = tmp_path / "plain.parquet"
    _write(plain, _values("wide"), use_dictionary=False)
    with pytest.raises(UnsupportedLayoutError):
        _decode(plain)
    good = tmp_path / "good.parquet"
    _write(good, _values("wide"), compression="none")
    chunk = pq.ParquetFile(good).metadata.row_group(0).column(0)
    data = bytearray(good.read_bytes())
    data[chunk.data_page_offset + 300] ^= 0xFF  # a flipped byte inside a data page
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(bytes(data))
    with pytest.raises(CorruptPageError):
        _decode(broken)


@pytest.fixture(scope="module")
def int8_dataset(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from helpers import config, write_corpus

    from pipeline.write.embed import embed_corpus

    root = tmp_path_factory.mktemp("int8")
    corpus = write_corpus(root / "corpus")
    embed_corpus(config(tiny_model_dir, [str(corpus / "*")], str(root / "ds"), min_items=3,
                        dtype="int8"))
    return root / "ds"


MIXES = [Mix("top", (0.0, 0.0, 1.0)), Mix("average", (1.0, 1.0, 1.0)),
         Mix("custom", (0.2, 0.3, 0.5), gamma=0.7), Mix("no-layer-0", (0.0, 0.6, 0.4), gamma=1.9),
         Mix("layer-0", (1.0, 0.0, 0.0))]


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: m.name)
def test_fused_int8_mix_is_bitwise_the_reference(int8_dataset: Path, mix: Mix,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct path (taken: the pyarrow reader is switched off) gives bitwise what
    ``mix_arrays`` gives on the dequantized layers, in the same row order."""
    ds = open_dataset(str(int8_dataset))
    table = read_table(ds)
    layers = [table.column(f"layer_{k}").combine_chunks().flatten().to_numpy()
              .reshape(table.num_rows, -1) for k in range(3)]
    want = mix_arrays(layers, mix)

    def no_pyarrow(*args: object, **kwargs: object) -> None:
        raise AssertionError("the int8 mix fell back to pyarrow")

    if any(mix.weights[1:]):  # a mix of layer 0 alone has no int8 column to decode
        monkeypatch.setattr(mixes, "mix_arrays", no_pyarrow)
    got = np.concatenate([v for _, v in iter_mixed(ds, mix, columns=(), workers=2)])
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), mix.name
