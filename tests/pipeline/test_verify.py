"""Every byte verifiable: page CRCs, `elmo dataset verify`, and `elmo embed --repair`.

Real datasets from the tiny model, damaged three ways (a flipped byte, a truncated file,
a deleted file) on local disk and on a moto S3 server: each damage is reported with its
work item, readers raise instead of returning other numbers, and a repair run rewrites
the damaged files to the bytes an uninterrupted run wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import s3fs
from helpers import config, write_corpus

from elmo_model.errors import ElmoUserError
from pipeline import cli
from pipeline.lookup.layers.mixes import iter_mixed
from pipeline.lookup.layers.parquet import CorruptPageError
from pipeline.write.embed import embed_corpus
from schemas.dataset import open_dataset
from schemas.files import open_fs
from schemas.manifest import RECORDS_CACHE, committed_items
from schemas.user_cache import CACHE_ENV
from schemas.verify import (
    CORRUPT,
    MISSING,
    OK,
    TRUNCATED,
    VERIFIED_FILE,
    expected_files,
    require_intact,
    verify_dataset,
)

DAMAGES = ("flip", "truncate", "delete")


def _s3_options(endpoint: str) -> dict:
    return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}


def _embed(model: Path, corpus: Path, out: str, options: dict | None = None, **kw: Any) -> Any:
    return embed_corpus(config(model, [str(corpus / "*")], out, min_items=3,
                               storage_options=options, **kw))


def _file_bytes(out: str, options: dict | None) -> dict[str, bytes]:
    """Every committed file's bytes, by path relative to the dataset."""
    fs, root = open_fs(out, options)
    return {rel: fs.cat_file(f"{root}/{rel}")
            for entry in committed_items(fs, root, "main").values()
            for rel in entry["files"].values()}


def _layer_page_offset(data: bytes) -> int:
    """A byte inside the first data page's values of the top layer (snappy): flipping it
    changes numbers without breaking the page's framing, the case only a CRC catches."""
    import pyarrow as pa

    metadata = pq.read_metadata(pa.BufferReader(data))
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    leaf = max(i for i, n in enumerate(names) if n.startswith("layer_"))
    chunk = metadata.row_group(0).column(leaf)
    return chunk.data_page_offset + chunk.total_compressed_size - 16


def _damage(fs: Any, path: str, how: str) -> None:
    data = fs.cat_file(path)
    if how == "flip":
        at = _layer_page_offset(data)
        fs.pipe_file(path, data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:])
    elif how == "truncate":
        fs.pipe_file(path, data[: len(data) // 2])
    else:
        fs.rm(path)


def _assert_readers_refuse(ds: Any) -> None:
    """Our readers never return numbers from a page that fails its CRC: the direct page
    reader (a plain mix) and pyarrow's (a token-normalised mix) both raise, naming the
    fix."""
    for mix in ("top", {"weights": [0.0, 0.0, 1.0], "gamma": 1.0, "token_norm": True}):
        with pytest.raises(CorruptPageError, match="--repair"):
            for _ in iter_mixed(ds, ds.mix(mix)):
                pass


def _check_damage_reported_and_repaired(model: Path, corpus: Path, out: str,
                                        reference: dict[str, bytes],
                                        options: dict | None) -> None:
    fs, root = open_fs(out, options)
    entries = committed_items(fs, root, "main")
    assert len(entries) >= len(DAMAGES)
    # One damage per item, each in its tokens file: item k gets DAMAGES[k].
    ds = open_dataset(out, options)
    # What SQL and the server check first: each file version once, then only new ones.
    require_intact(out, options)
    assert require_intact(out, options).files == []
    damaged = {}
    for (item, entry), how in zip(sorted(entries.items()), DAMAGES, strict=False):
        rel = entry["files"]["tokens"]
        _damage(fs, f"{root}/{rel}", how)
        damaged[rel] = (item, how)
        if how == "flip":
            _assert_readers_refuse(ds)
            # DuckDB reads no page CRCs: SQL over a dataset checks the manifest first. The
            # damaged file is a new version (its change time or ETag), so it is read again.
            with pytest.raises(ElmoUserError, match=f"corrupt: {rel}.*--repair"):
                require_intact(out, options)

    report = verify_dataset(fs, root, ds.descriptor)
    status = {c.path: c for c in report.problems}
    expected = {"flip": CORRUPT, "truncate": TRUNCATED, "delete": MISSING}
    assert {rel: (c.item, c.status) for rel, c in status.items()} == {
        rel: (item, expected[how]) for rel, (item, how) in damaged.items()}
    assert all(c.status == OK for c in report.files if c.path not in damaged)
    assert all(c.part == "main" and c.source["source"].startswith("file://")
               and c.source["end"] > c.source["start"] for c in report.problems)
    assert report.bad_items() == {"main": {item for item, _ in damaged.values()}}

    summary = _embed(model, corpus, out, options, repair=True)
    assert summary.items_written == len(damaged)
    assert len(summary.repaired) == len(damaged)
    assert _file_bytes(out, options) == reference
    assert not verify_dataset(fs, root, ds.descriptor).problems


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[Path, dict[str, bytes]]:
    """An uninterrupted run's files: what every repair must give back, byte for byte."""
    base = tmp_path_factory.mktemp("verify-ref")
    corpus = write_corpus(base / "corpus")
    out = str(base / "ds")
    _embed(tiny_model_dir, corpus, out)
    return corpus, _file_bytes(out, None)


def test_files_carry_page_checksums_and_a_clean_dataset_verifies(
        tiny_model_dir: Path, reference: tuple[Path, dict[str, bytes]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    corpus, files = reference
    out = tmp_path / "ds"
    _embed(tiny_model_dir, corpus, str(out))
    assert _file_bytes(str(out), None) == files  # deterministic: same bytes every run
    # A page CRC flipped by one bit is refused by pyarrow with verification on.
    rel = next(r for r in files if r.startswith("tokens/"))
    path = out / rel
    data = bytearray(path.read_bytes())
    data[_layer_page_offset(bytes(data))] ^= 0x01
    clean = pq.read_table(out / rel)
    path.write_bytes(bytes(data))
    assert not pq.read_table(path).equals(clean)  # unchecked, the numbers change silently
    with pytest.raises(OSError, match="CRC"):
        pq.read_table(path, page_checksum_verification=True)
    path.write_bytes(files[rel])

    assert cli.main(["dataset", "verify", str(out), "--no-progress"]) == 0
    assert "all match the manifest" in capsys.readouterr().out
    assert cli.main(["dataset", "verify", str(out), "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["files_checked"] == len(files)
    assert report["bytes_checked"] == sum(len(b) for b in files.values())
    assert cli.main(["dataset", "verify", str(tmp_path / "nothing"), "--no-progress"]) == 2


def test_flip_truncate_delete_on_local_disk_are_reported_and_repaired(
        tiny_model_dir: Path, reference: tuple[Path, dict[str, bytes]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    corpus, files = reference
    out = str(tmp_path / "ds")
    _embed(tiny_model_dir, corpus, out)
    fs, root = open_fs(out)
    entries = committed_items(fs, root, "main")
    item, entry = sorted(entries.items())[0]
    _damage(fs, f"{root}/{entry['files']['tokens']}", "flip")

    # The CLI: one line per damaged file, naming the item; exit 1.
    assert cli.main(["dataset", "verify", out, "--no-progress"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"corrupt: {entry['files']['tokens']}: sha256")
    assert f"[part main item {item} (" in lines[0]
    assert "--repair" in lines[-1]
    query = "SELECT sum(list_sum(layer_1::FLOAT[])) FROM tokens"
    assert cli.main(["sql", out, "--verify", query]) == 2
    assert "--repair" in capsys.readouterr().err
    # Without --verify too (each file version is checked once), and the server will not start.
    assert cli.main(["sql", out, query]) == 2
    assert cli.main(["serve", out, "--port", "0"]) == 2
    assert capsys.readouterr().err.count("--repair") == 2
    # A truncated file fails in DuckDB itself, without --verify.
    _damage(fs, f"{root}/{entry['files']['tokens']}", "truncate")
    from pipeline.lookup.sql import run_query

    with pytest.raises(ElmoUserError):
        run_query(out, "SELECT sum(list_sum(layer_1::FLOAT[])) FROM tokens")
    fs.pipe_file(f"{root}/{entry['files']['tokens']}", files[entry["files"]["tokens"]])

    _check_damage_reported_and_repaired(tiny_model_dir, corpus, out, files, None)


@pytest.mark.slow
def test_flip_truncate_delete_on_s3_are_reported_and_repaired(
        s3_endpoint: str, tiny_model_dir: Path, reference: tuple[Path, dict[str, bytes]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    options = _s3_options(s3_endpoint)
    s3 = s3fs.S3FileSystem(**options)
    s3.mkdir("verify-bucket")
    corpus, files = reference
    out = "s3://verify-bucket/ds"
    _embed(tiny_model_dir, corpus, out, options)
    assert _file_bytes(out, options) == files
    _check_damage_reported_and_repaired(tiny_model_dir, corpus, out, files, options)


def test_commit_records_on_s3_are_read_once_per_version(
        s3_endpoint: str, tiny_model_dir: Path, reference: tuple[Path, dict[str, bytes]],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On an object store each commit record is fetched once per version (one concurrent
    request for all that are new), then answered from the per-user cache, which the
    listing keeps honest: a rewritten record is read again, a deleted one is gone."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    options = _s3_options(s3_endpoint)
    s3fs.S3FileSystem(**options).mkdir("records-bucket")
    corpus, _ = reference
    out = "s3://records-bucket/ds"
    _embed(tiny_model_dir, corpus, out, options)
    fs, root = open_fs(out, options)
    folder = f"{root}/_manifest/main"

    def stored() -> dict[int, dict]:
        return {int(p.rsplit("=", 1)[1][:-5]): json.loads(fs.cat_file(p))
                for p in fs.ls(folder, detail=False) if "shard=" in p}

    records = stored()
    assert len(records) >= 3
    assert committed_items(fs, root, "main") == records
    [cache_file] = (tmp_path / "cache" / RECORDS_CACHE).iterdir()
    cached = json.loads(cache_file.read_text())
    assert sorted(cached["records"]) == sorted(f"shard={k}.json" for k in records)

    # Answered from the cache: an entry planted under the record's current version is what
    # comes back, so the record itself was not fetched.
    cached["records"]["shard=1.json"]["entry"]["planted"] = True
    cache_file.write_text(json.dumps(cached))
    assert committed_items(fs, root, "main")[1]["planted"] is True
    assert open_dataset(out, options).shard_files()  # readers go through the same listing

    # A rewritten record is a new version (ETag), read again; a deleted one is gone.
    rewritten = stored()[1] | {"note": "rewritten"}
    fs.pipe_file(f"{folder}/shard=1.json", json.dumps(rewritten).encode())
    fs.rm(f"{folder}/shard=2.json")
    left = {k: v for k, v in records.items() if k != 2} | {1: rewritten}
    assert committed_items(fs, root, "main") == stored() == left
    assert sorted(json.loads(cache_file.read_text())["records"]) == sorted(
        f"shard={k}.json" for k in left)

    # An unreadable cache is started again.
    cache_file.write_text("{not json")
    assert committed_items(fs, root, "main") == stored()
    assert len(json.loads(cache_file.read_text())["records"]) == len(left)


def test_records_without_hashes_are_checked_by_size_rows_and_schema(
        tiny_model_dir: Path, reference: tuple[Path, dict[str, bytes]],
        tmp_path: Path) -> None:
    corpus, _ = reference
    out = str(tmp_path / "ds")
    _embed(tiny_model_dir, corpus, out)
    fs, root = open_fs(out)
    for item, entry in committed_items(fs, root, "main").items():
        entry.pop("sha256")
        fs.pipe_file(f"{root}/_manifest/main/shard={item}.json", json.dumps(entry).encode())
    ds = open_dataset(out)
    report = verify_dataset(fs, root, ds.descriptor)
    assert report.files and all(c.ok and "no hash" in c.detail for c in report.files)
    # Row counts still come from the footer: a record that disagrees is reported.
    item, entry = sorted(committed_items(fs, root, "main").items())[0]
    entry["counts"]["tokens"] += 1
    fs.pipe_file(f"{root}/_manifest/main/shard={item}.json", json.dumps(entry).encode())
    bad = verify_dataset(fs, root, ds.descriptor).problems
    assert [(c.item, c.table, c.status) for c in bad] == [(item, "tokens",
                                                           "row count mismatch")]
    # And the schema: a file of other columns, recorded with its own size, is reported.
    entry["counts"]["tokens"] -= 1
    rel = entry["files"]["sentences"]
    pq.write_table(pq.read_table(f"{root}/{rel}").drop_columns(["n_windows"]), f"{root}/{rel}")
    entry["bytes"]["sentences"] = fs.size(f"{root}/{rel}")
    fs.pipe_file(f"{root}/_manifest/main/shard={item}.json", json.dumps(entry).encode())
    bad = verify_dataset(fs, root, ds.descriptor).problems
    assert [(c.item, c.table, c.status, c.detail) for c in bad] == [
        (item, "sentences", "schema mismatch", "missing n_windows")]


def test_sql_remembers_intact_file_versions_in_the_user_cache(
        tiny_model_dir: Path, reference: tuple[Path, dict[str, bytes]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    corpus, _ = reference
    out = str(tmp_path / "ds")
    _embed(tiny_model_dir, corpus, out)
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    query = "SELECT count(*) AS n FROM tokens"
    assert cli.main(["sql", out, "--no-verify", query]) == 0
    assert not cache.exists()  # --no-verify reads and remembers nothing
    assert cli.main(["sql", out, query]) == 0
    remembered = json.loads((cache / VERIFIED_FILE).read_text())
    fs, root = open_fs(out)
    assert len(remembered) == len(expected_files(fs, root))
    assert require_intact(out).files == []
    assert len(require_intact(out, remember=False).files) == len(remembered)
    # An unreadable cache is started again, not an error.
    (cache / VERIFIED_FILE).write_text("{not json")
    assert cli.main(["sql", out, query]) == 0
    assert len(json.loads((cache / VERIFIED_FILE).read_text())) == len(remembered)
    assert "n" in capsys.readouterr().out
