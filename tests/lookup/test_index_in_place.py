"""A compact index whose exact re-rank reads the dataset's own int8 pages in place: the
same bytes as a copy, bit for bit, and the same hits; a copy where the layout does not
allow it (compressed pages, a mix of several layers); a dataset file rewritten under the
index refused in one line, not read at the old offsets."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from synthetic_dataset import write_synthetic

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index import row_vectors
from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.ivf_search import IVF_DIR
from pipeline.lookup.index.ivf_shards import ShardedIvf
from pipeline.lookup.index.row_vectors import IN_PLACE_FILES, VECTORS_FILE
from pipeline.lookup.index.sense_index import SenseIndex
from pipeline.lookup.index.shard_files import PREAD_ROWS
from pipeline.write import item_files
from schemas.int8_column_chunk import ChunkCodec

DIM = 32
ROWS = 3_000
KEYS = ["doc_id", "sent_idx", "tok_idx"]


def _shard_folders(ix: Path) -> list[Path]:
    index = SenseIndex(str(ix))
    return [ix / IVF_DIR / s["folder"] for s in index.meta.ivf["shards"].values()]


def _all_vectors(ix: Path) -> np.ndarray:
    ivf = SenseIndex(str(ix)).ivf()
    assert isinstance(ivf, ShardedIvf)
    return ivf.vectors[np.arange(len(ivf.vectors))]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One int8 dataset (uncompressed pages, the default), indexed in place and, with
    the in-place path turned off, as a copy."""
    root = tmp_path_factory.mktemp("in_place")
    write_synthetic(root / "ds", ROWS, DIM, n_shards=2, vocab=200, dtype="int8")
    build_index(str(root / "ds"), "top", str(root / "ix"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(row_vectors, "in_place_layer", lambda ds, mix: None)
        build_index(str(root / "ds"), "top", str(root / "copy"))
    return root


def test_in_place_rows_equal_the_copy_bit_for_bit(built: Path) -> None:
    """The shards hold offsets into the dataset, not vectors; the rows read through them
    are the copy's bytes, and a search finds the same hits at the same distances."""
    for folder in _shard_folders(built / "ix"):
        assert all((folder / name).exists() for name in IN_PLACE_FILES)
        assert not (folder / VECTORS_FILE).exists()
    for folder in _shard_folders(built / "copy"):
        assert (folder / VECTORS_FILE).exists()
        assert not (folder / IN_PLACE_FILES[1]).exists()
    in_place, copy = _all_vectors(built / "ix"), _all_vectors(built / "copy")
    assert in_place.dtype == copy.dtype == np.int8 and in_place.shape == (ROWS, DIM)
    assert np.array_equal(in_place, copy)
    # A query's few rows are read a call a row, many through a map: the same bytes.
    for ix in ("ix", "copy"):
        vectors = SenseIndex(str(built / ix)).ivf().vectors
        every = np.arange(ROWS)
        assert ROWS > 2 * PREAD_ROWS and len(vectors.files) == 2  # > PREAD_ROWS a file
        assert np.array_equal(np.concatenate([vectors.read_rows(every[i:i + 100])
                                              for i in range(0, ROWS, 100)]),
                              vectors.read_rows(every))
    picks = np.random.default_rng(3).choice(ROWS, 40, replace=False)
    positions = np.sort(picks)
    assert np.array_equal(SenseIndex(str(built / "ix")).ivf().vectors[picks],
                          copy[picks])
    for query in copy[positions[:5]].astype(np.float32):
        a = SenseIndex(str(built / "ix")).search(query, k=10, columns=KEYS)
        b = SenseIndex(str(built / "copy")).search(query, k=10, columns=KEYS)
        for column in KEYS:
            assert a[column].to_pylist() == b[column].to_pylist()
        assert np.allclose(a["_distance"].to_numpy(), b["_distance"].to_numpy())


def test_the_index_is_smaller_than_its_copy(built: Path) -> None:
    """An offset a row (8 bytes) instead of ``dim`` bytes: the vectors' part shrinks."""
    def vector_bytes(ix: Path) -> int:
        return sum((f / name).stat().st_size for f in _shard_folders(ix)
                   for name in (VECTORS_FILE, *IN_PLACE_FILES) if (f / name).exists())
    assert vector_bytes(built / "ix") < vector_bytes(built / "copy")


def test_a_dataset_file_rewritten_under_the_index_is_refused(built: Path,
                                                             tmp_path: Path) -> None:
    """A dataset file written again (other bytes at the recorded offsets) stops the search
    with one line naming the file and the rebuild, instead of reading wrong rows."""
    import shutil

    shutil.copytree(built / "ds", tmp_path / "ds")
    build_index(str(tmp_path / "ds"), "top", str(tmp_path / "ix"))
    record = SenseIndex(str(tmp_path / "ix")).meta.ivf
    source = (tmp_path / "ix" / IVF_DIR / next(iter(record["shards"].values()))["folder"]
              / IN_PLACE_FILES[1])
    import json

    path = json.loads(source.read_text())["path"]
    table = pq.read_table(path)
    pq.write_table(table, path, compression="zstd")  # same rows, pyarrow's pages
    index = SenseIndex(str(tmp_path / "ix"))
    with pytest.raises(ElmoUserError) as caught:
        index.search(np.ones(DIM, np.float32), k=5, columns=KEYS)
    message = str(caught.value)
    assert "\n" not in message and os.path.basename(path) in message
    assert "changed since the index was built" in message and "elmo index build" in message


def test_compressed_pages_and_mixes_of_layers_keep_a_copy(tmp_path: Path) -> None:
    """A dataset written with zstd pages (as before 2026-11-29) and a mix of several
    layers cannot be read in place: their shards hold an int8 copy, searched alike."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(item_files, "INT8_CODEC", ChunkCodec("zstd"))
        write_synthetic(tmp_path / "ds", 1_200, DIM, n_shards=1, vocab=100, dtype="int8")
    first = next((tmp_path / "ds").rglob("*.parquet"))
    assert row_vectors.uncompressed_row_pages(str(first), "layer_2") is None
    build_index(str(tmp_path / "ds"), "top", str(tmp_path / "ix"))
    build_index(str(tmp_path / "ds"), "average", str(tmp_path / "avg"))
    for ix in (tmp_path / "ix", tmp_path / "avg"):
        for folder in _shard_folders(ix):
            assert (folder / VECTORS_FILE).exists()
            assert not (folder / IN_PLACE_FILES[0]).exists()
        hits = SenseIndex(str(ix)).search(np.ones(DIM, np.float32), k=5, columns=KEYS)
        assert hits.num_rows == 5
