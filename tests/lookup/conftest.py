"""Fixtures shared by the sense index's tests (``tests/lookup``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_dataset import write_synthetic

SHARDED_DIM = 64
SHARDED_ROWS = 4_000


@pytest.fixture(scope="session")
def sharded_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic dataset ``ds`` (``SHARDED_ROWS`` rows of ``SHARDED_DIM``, two shard
    files, 200 words) and its compact index ``ix`` with product-quantized codes: built once,
    for the one-process and the Ray tests of an IVF in shards (tests copy it to change it)."""
    from pipeline.lookup.index import ivf_shards_build
    from pipeline.lookup.index.build import build_index

    root = tmp_path_factory.mktemp("shards")
    write_synthetic(root / "ds", SHARDED_ROWS, SHARDED_DIM, n_shards=2,
                                   vocab=200)
    with pytest.MonkeyPatch.context() as patch:
        # Product-quantized codes from 1,000 rows on (the product asks 9,984: 39 points for
        # each of 256 centroids), so that a small table tests them.
        patch.setattr(ivf_shards_build, "PQ_MIN_ROWS", 1_000)
        build_index(str(root / "ds"), "top", str(root / "ix"), compact=True)
    return root
