"""Fail fast and leave nothing half made: requests the machine cannot serve, a broken
model, a foreign --out, a leftover of a killed run, another tokenizer, an old dataset."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, config, run_cli, write_corpus

from elmo_model.errors import ElmoUserError
from pipeline.tokenize import get_tokenizer, model_tokenizer, tokenizer_names
from pipeline.write.embed import embed_corpus
from pipeline.write.ray_setup import choose_executor, gpus_per_actor

PROGRAM = ("import sys; from pipeline import cli; cli.REGISTRARS = ('pipeline.embed_cli',); "
           "sys.exit(cli.main(sys.argv[1:]))")


def snapshot(folder: Path) -> dict[str, bytes] | None:
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b""
            for p in sorted(folder.rglob("*"))}


@pytest.mark.slow
@pytest.mark.parametrize("existing", [False, True])
def test_readme_gpu_line_on_a_gpu_less_machine_fails_at_once(tmp_path: Path,
                                                             existing: bool) -> None:
    """`elmo embed <corpus> --out <dir> --actors 4 --device cuda` (the README's cluster
    line, with the bundled model) where no GPU is visible (a machine's own are hidden from
    the command): one line, within seconds, no output."""
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    if existing:
        out.mkdir()
    before = snapshot(out)
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_ADDRESS="", CUDA_VISIBLE_DEVICES="")
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-c", PROGRAM, "embed", str(corpus), "--out", str(out),
                          "--actors", "4", "--device", "cuda"],
                         env=env, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - t0
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith("elmo: error: --actors 4 with --device cuda need 4 GPUs")
    assert "--device cpu" in lines[0]
    assert seconds < 30, f"took {seconds:.1f} s to refuse"
    assert snapshot(out) == before  # the output is as it was found


@pytest.mark.slow
def test_a_ray_address_nothing_answers_fails_in_seconds(tmp_path: Path) -> None:
    """`elmo embed --ray-address HOST:PORT` where no cluster listens: one line naming the
    fix within seconds (``ray.init`` alone waits minutes), and no output written."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    corpus = write_corpus(tmp_path / "corpus")
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_ADDRESS="")
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-c", PROGRAM, "embed", str(corpus), "--out",
                          str(tmp_path / "ds"), "--ray-address", f"127.0.0.1:{port}"],
                         env=env, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - t0
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith(f"elmo: error: no Ray cluster answers at 127.0.0.1:{port}")
    assert "ray start --head" in lines[0]
    assert seconds < 30, f"took {seconds:.1f} s to refuse"
    assert not (tmp_path / "ds").exists()


def test_a_broken_model_leaves_no_dataset_and_the_fixed_rerun_works(tiny_model_dir: Path,
                                                                    tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    weights = next(broken.glob("weights.*"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    out = tmp_path / "ds"
    with pytest.raises(ElmoUserError):
        embed_corpus(config(broken, [f"{corpus}/*"], out))
    assert not out.exists()  # nothing half made
    out.mkdir()
    with pytest.raises(ElmoUserError):
        embed_corpus(config(broken, [f"{corpus}/*"], out))
    assert snapshot(out) == {}
    summary = embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out))
    assert summary.documents == 9


def test_a_killed_run_before_its_first_commit_does_not_block_a_corrected_rerun(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """What kill -9 leaves before the first commit (descriptor, plan, lock, staging) of a
    run with the wrong model and inputs: a rerun with the right ones is accepted."""
    from pipeline.write.output import check_plan, ensure_descriptor
    from schemas import DatasetDescriptor
    from schemas.files import open_fs

    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    fs, root = open_fs(str(out))
    wrong = DatasetDescriptor(model_fingerprint="00" * 32, n_output_layers=2, dim=4,
                              dtype="float32", n_shards=0, tokenizer={"name": "x"})
    fs.makedirs(root, exist_ok=True)
    ensure_descriptor(fs, root, wrong)
    check_plan(fs, root, "main", {"sources": [["file:///elsewhere", 1, "1"]]})
    (out / "_staging/old-run/abc/tokens/shard=0").mkdir(parents=True)
    (out / "_staging/old-run/abc/tokens/shard=0/main.parquet").write_bytes(b"partial")
    summary = embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out))
    assert summary.documents == 9 and not (out / "_staging").exists()
    assert json.loads((out / "_dataset.json").read_text())["model_fingerprint"] != "00" * 32
    # Once data is committed, the descriptor is binding again.
    with pytest.raises(ElmoUserError, match="different settings"):
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out, dtype="float32"))


def test_out_must_be_new_empty_or_a_dataset(tiny_model_dir: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    before = snapshot(home)
    with pytest.raises(ElmoUserError, match="not empty and not an elmo-store dataset"):
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], home))
    assert snapshot(home) == before
    with pytest.raises(ElmoUserError, match="is a file"):
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], home / "notes.txt"))


def test_tokenizer_is_the_models_by_default_recorded_and_binding(tiny_model_dir: Path,
                                                                 tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], out))
    declared = get_tokenizer(model_tokenizer(str(tiny_model_dir / "options.json")))
    recorded = json.loads((out / "_dataset.json").read_text())["tokenizer"]
    assert recorded == {**declared.record(), "max_sentence_tokens": 256, "window_overlap": 32}

    other = next(n for n in tokenizer_names() if n != declared.name)
    with pytest.raises(ElmoUserError, match=f"pass tokenizer {declared.name}"):
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], out, tokenizer=other))
    # The explicit name of the recorded tokenizer is the same request: accepted.
    again = embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], out,
                                tokenizer=declared.name))
    assert again.items_written == 0 and again.totals["documents"] == 5

    # Another tokenizer into a new dataset: recorded, and the tokens are its own.
    explicit = tmp_path / "explicit"
    embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], explicit, tokenizer=other))
    assert json.loads((explicit / "_dataset.json").read_text())["tokenizer"]["name"] == other
    with pytest.raises(ElmoUserError, match="unknown tokenizer"):
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], tmp_path / "x",
                            tokenizer="no-such-tokenizer"))


def test_a_version_1_dataset_reads_but_refuses_appends(tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    """Schema 1 (hash shards) datasets stay readable; adding to one is refused with a
    message that says what to do."""
    import pyarrow.parquet as pq

    from schemas.dataset import open_dataset

    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], out, part="old"))
    descriptor = json.loads((out / "_dataset.json").read_text())
    descriptor.update(schema_version=1, n_shards=8)  # what release 1 wrote
    (out / "_dataset.json").write_text(json.dumps(descriptor))
    documents = open_dataset(str(out)).paths("documents")
    assert documents and sum(pq.read_table(path).num_rows for path in documents) == 5
    with pytest.raises(ElmoUserError, match=r"schema version 1.*write to a new out"):
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], out, part="new"))


def test_embed_help_teaches(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from pipeline import embed_cli

    parser = argparse.ArgumentParser(prog="elmo")
    embed_cli.register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["embed", "--help"])
    text = capsys.readouterr().out
    assert "main job" in text and "examples:" in text
    assert "--ray-address auto" in text and "--wait-for-resources" in text
    assert all(name in text for name in tokenizer_names())  # --tokenizer lists them
    assert "--item-tokens" in text and "work items" in text


def test_gpus_per_actor_is_a_flag_and_a_request_no_machine_holds_fails_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        tiny_model_dir: Path) -> None:
    """``--gpus-per-actor`` (API-only before) reaches the run: it picks Ray, and 64 GPUs
    per actor are refused before Ray starts or the output is touched."""
    cfg = config(tiny_model_dir, ["c"], tmp_path / "x", executor="auto", gpus_per_actor=0.5)
    assert choose_executor(cfg) == "ray" and gpus_per_actor(cfg, cluster_gpus=0) == 0.5
    assert gpus_per_actor(dataclasses.replace(cfg, device="cpu"), cluster_gpus=4) == 0
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    monkeypatch.setenv("RAY_ADDRESS", "")
    code = run_cli(monkeypatch, ["embed", str(corpus), "--out", str(out), "--model",
                                 str(tiny_model_dir), "--gpus-per-actor", "64"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert err.startswith("elmo: error: --actors 1 with --gpus-per-actor 64 need 64 GPUs")
    assert not out.exists()
