"""The store's live view, explicit source files, empty shards and the compute flags."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.write.config import flag_of
from pipeline.write.embed import EmbedConfig, ModelSpec, embed_corpus
from pipeline.write.inputs import list_sources
from pipeline.write.output import PlanMismatchError
from schemas.dataset import open_dataset
from schemas.files import open_fs
from schemas.manifest import list_files, live_parts, publish_live


def config(model_dir: Path, sources: list[str], out: Path | str, **kw: object) -> EmbedConfig:
    kw.setdefault("progress", False)
    kw.setdefault("executor", "local")
    return EmbedConfig(sources=sources, out=str(out), model=ModelSpec.resolve(str(model_dir)),
                       **kw)  # type: ignore[arg-type]


def corpus(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("The cat sat on the mat.\nIt was happy!\n")
    (folder / "sub/b.txt").write_text("One more file. Two sentences here.\nShort\n")
    return folder


def rows(out: Path, table: str = "tokens") -> list[dict]:
    fs, root = open_fs(str(out))
    got = []
    for file in list_files(fs, root, table):
        got += pq.read_table(file.path).to_pylist()
    return sorted(got, key=lambda r: (r["doc_id"], r.get("sent_idx", 0), r.get("tok_idx", 0)))


def test_source_files_give_the_ids_and_vectors_of_a_glob_run(tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    src = corpus(tmp_path / "corpus")
    glob = f"{src}/**/*.txt"
    embed_corpus(config(tiny_model_dir, [glob], tmp_path / "all", min_items=2))
    b_rows = [r for r in rows(tmp_path / "all") if r["doc_id"].startswith("sub/b.txt")]
    assert {r["doc_id"] for r in b_rows} == {"sub/b.txt:1", "sub/b.txt:2"}

    # By URI (looked up in the glob's listing) and as a SourceFile (used as given).
    by_uri = (f"file://{src}/sub/b.txt",)
    listed = tuple(s for s in list_sources([glob]) if s.path.endswith("sub/b.txt"))
    for name, files in (("uri", by_uri), ("source", listed)):
        embed_corpus(config(tiny_model_dir, [glob], tmp_path / name, min_items=2,
                            source_files=files))
        assert rows(tmp_path / name) == b_rows  # same ids, same shards, same vectors

    with pytest.raises(ElmoUserError, match="not matched"):
        embed_corpus(config(tiny_model_dir, [f"{src}/*.txt"], tmp_path / "bad",
                            source_files=(f"file://{src}/sub/b.txt",)))


def test_empty_shards_write_no_files_but_are_committed(tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    from pipeline.lookup.sql import connect

    src = corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    first = embed_corpus(config(tiny_model_dir, [f"{src}/**/*.txt"], out, min_items=16))
    assert first.items_written >= 16  # at least --shards work items, cut at line starts
    entries = sorted((out / "_manifest/main").glob("shard=*.json"))
    assert len(entries) == first.items_written  # every item committed, with or without rows
    on_disk = {str(p.relative_to(out)) for p in out.glob("*/shard=*/*.parquet")}
    listed = {f for e in entries for f in json.loads(e.read_text())["files"].values()}
    assert on_disk == listed  # the manifest lists exactly the files that exist
    assert len(on_disk) < first.items_written * 3 and not list(out.glob("errors/*/*.parquet"))
    for entry in entries:  # a table has a file exactly when it has rows
        data = json.loads(entry.read_text())
        assert {t for t, n in data["counts"].items() if n} == set(data["files"])
        assert data["info"] == {"compute_dtype": "float32"}

    ds = open_dataset(str(out))
    assert all(Path(p).exists() for p in ds.paths("tokens"))
    con = connect(ds)
    try:
        assert con.sql("SELECT count(*) FROM tokens").fetchall()[0][0] == first.tokens
        assert con.sql("SELECT count(*) FROM errors").fetchall()[0][0] == 0  # empty view
    finally:
        con.close()

    again = embed_corpus(config(tiny_model_dir, [f"{src}/**/*.txt"], out, min_items=16))
    assert again.items_written == 0 and again.items_resumed == first.items_written
    assert again.totals == first.totals


def test_readers_follow_the_published_live_view(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A part that is committed but not published is invisible to every reader."""
    from pipeline.lookup.sql import connect

    src = corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    embed_corpus(config(tiny_model_dir, [f"{src}/a.txt"], out, min_items=2, part="old"))
    fs, root = open_fs(str(out))
    assert live_parts(fs, root) == ["old"]  # nothing published: every committed part
    publish_live(fs, root, {"old"})
    embed_corpus(config(tiny_model_dir, [f"{src}/sub/b.txt"], out, min_items=2, part="new"))

    def seen() -> tuple[set[str], set[str], set[str]]:
        con = connect(str(out))
        try:
            docs = {r[0] for r in con.sql("SELECT doc_id FROM documents").fetchall()}
        finally:
            con.close()
        parts = {k.split("/")[0] for k, _ in open_dataset(str(out)).shard_files("tokens")}
        files = {Path(f).stem for f in open_dataset(str(out)).paths("tokens")}
        return docs, parts, files

    assert seen() == ({"a.txt:1", "a.txt:2"}, {"old"}, {"old"})
    publish_live(fs, root, {"new"})  # one atomic write switches every reader
    assert seen() == ({"b.txt:1", "b.txt:2"}, {"new"}, {"new"})
    data = json.loads((out / "_live.json").read_text())
    assert data["format"] == "elmo-store/live" and data["parts"] == ["new"]
    # Plain JSON: a reader without our code gets the file list from it.
    assert {f for s in data["shards"] for f in s["files"].values()} == {
        str(p.relative_to(out)) for p in out.glob("*/shard=*/new.parquet")}


def test_plan_mismatch_is_typed(tiny_model_dir: Path, tmp_path: Path) -> None:
    src = corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    embed_corpus(config(tiny_model_dir, [f"{src}/a.txt"], out, min_items=2))
    with pytest.raises(PlanMismatchError, match="other inputs") as caught:
        embed_corpus(config(tiny_model_dir, [f"{src}/**/*.txt"], out, min_items=2))
    assert caught.value.part == "main" and isinstance(caught.value, ElmoUserError)


def test_device_and_compute_dtype_flags(tiny_model_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from pipeline import embed_cli

    parser = argparse.ArgumentParser()
    embed_cli.register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["embed", "--help"])
    text = capsys.readouterr().out
    assert "--device {auto,cpu,cuda}" in text
    assert "--compute-dtype {float32,bfloat16,float16}" in text and "CUDA only" in text

    src = corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    args = parser.parse_args(["embed", f"{src}/a.txt", "--out", str(out), "--shards", "2",
                              "--device", "cpu", "--compute-dtype", "bfloat16",
                              "--model", str(tiny_model_dir), "--no-progress"])
    assert args.handler(args) == 0
    descriptor = json.loads((out / "_dataset.json").read_text())
    assert descriptor["extra"]["compute_dtype"] == "bfloat16"
    # Informative only: a rerun with other compute settings is not refused.
    fp32 = embed_corpus(config(tiny_model_dir, [f"{src}/a.txt"], out, min_items=2,
                               device="cpu"))
    assert fp32.items_resumed == 2

    with pytest.raises(ElmoUserError, match="CUDA"):
        embed_corpus(config(tiny_model_dir, [f"{src}/a.txt"], tmp_path / "fp16", min_items=2,
                            device="cpu", compute_dtype="float16"))
    with pytest.raises(SettingError, match=r"^device: ") as caught:  # the library's name
        embed_corpus(config(tiny_model_dir, [f"{src}/a.txt"], tmp_path / "x", device="tpu"))
    assert caught.value.named(flag_of).startswith("--device: ")  # the CLI's


def test_reuse_models_loads_a_model_once(tiny_model_dir: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import elmo_model
    from pipeline.write.work_item import reuse_models

    loads = []
    real = elmo_model.load

    def counting(*args: object, **kwargs: object) -> object:
        loads.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(elmo_model, "load", counting)
    src = corpus(tmp_path / "corpus")
    with reuse_models():
        for name in ("a.txt", "sub/b.txt"):
            embed_corpus(config(tiny_model_dir, [f"{src}/{name}"], tmp_path / "ds",
                                min_items=2, part=name.replace("/", "-")))
    assert len(loads) == 1
    embed_corpus(config(tiny_model_dir, [f"{src}/a.txt"], tmp_path / "other", min_items=2))
    assert len(loads) == 2  # outside the block: no cache
