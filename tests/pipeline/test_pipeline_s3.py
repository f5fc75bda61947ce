"""S3 round trip against a local moto server: corpus in a bucket, dataset into a bucket."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import s3fs
from helpers import config, write_corpus

from pipeline.lookup.layers.mixes import iter_mixed
from pipeline.write.embed import embed_corpus
from schemas.dataset import open_dataset


@pytest.mark.slow
def test_s3_round_trip(s3_endpoint: str, tiny_model_dir: Path, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    import duckdb
    import pyarrow.dataset as pds
    import pyarrow.fs as pafs

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": s3_endpoint}}
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("corpus-bucket")
    fs.mkdir("data-bucket")
    local = write_corpus(tmp_path / "corpus")
    for path in local.iterdir():
        fs.put(str(path), f"corpus-bucket/in/{path.name}")

    out = "s3://data-bucket/ds"
    # float16: the layout the direct page reader (checked below over S3) reads.
    summary = embed_corpus(config(tiny_model_dir, ["s3://corpus-bucket/in/*"], out, min_items=2,
                                  storage_options=options, dtype="float16"))
    assert summary.documents == 9 and summary.errors == 0
    assert fs.exists("data-bucket/ds/_dataset.json")
    assert not fs.exists("data-bucket/ds/_lock")
    # One manifest entry per work item; no staging left on the bucket.
    assert len(fs.glob("data-bucket/ds/_manifest/main/shard=*.json")) == summary.items_written
    assert summary.items_written >= 2 and not fs.exists("data-bucket/ds/_staging")

    # The same data, read back by pyarrow's own S3 client and by DuckDB through fsspec.
    arrow_fs = pafs.S3FileSystem(access_key="testing", secret_key="testing",
                                 endpoint_override=s3_endpoint.removeprefix("http://"),
                                 scheme="http", region="us-east-1")
    table = pds.dataset("data-bucket/ds/tokens", filesystem=arrow_fs,
                        partitioning="hive").to_table()
    assert table.num_rows == summary.tokens
    con = duckdb.connect()
    con.register_filesystem(fs)
    n, docs = con.execute(
        "SELECT count(*), count(DISTINCT doc_id) FROM read_parquet(?, hive_partitioning=true)",
        [f"{out}/tokens/*/*.parquet"]).fetchone()
    assert (n, docs) == (summary.tokens, 9)

    # Mix on read through fsspec: the direct Parquet reader over pyarrow's PyFileSystem.
    ds = open_dataset(out, options)
    keys, vectors = [], []
    for meta, v in iter_mixed(ds, ds.mix("layer:1"), columns=("doc_id", "sent_idx", "tok_idx")):
        keys.append(meta)
        vectors.append(v)
    got = dict(zip(zip(*(pa.Table.from_batches(keys).column(c).to_pylist()
                         for c in ("doc_id", "sent_idx", "tok_idx")), strict=True),
                   np.concatenate(vectors), strict=True))
    assert len(got) == table.num_rows
    stored = table.column("layer_1").to_pylist()
    for i, key in enumerate(zip(*(table.column(c).to_pylist()
                                  for c in ("doc_id", "sent_idx", "tok_idx")), strict=True)):
        assert np.array_equal(got[key], np.asarray(stored[i], np.float32))

    # A rerun finds every shard committed and does no work.
    again = embed_corpus(config(tiny_model_dir, ["s3://corpus-bucket/in/*"], out, min_items=2,
                                storage_options=options, dtype="float16"))
    assert again.items_written == 0 and again.totals["tokens"] == summary.tokens
