"""The embedding pipeline end to end, in-process executor: real Parquet, real DuckDB.

The Ray executor is covered in test_pipeline_ray.py, S3 in test_pipeline_s3.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, TEXT_A, TEXT_B, config, dataset_files, read_table, run_cli, write_corpus

from elmo_model.errors import ElmoUserError
from pipeline.tokenize import get_tokenizer, model_tokenizer
from pipeline.write.embed import embed_corpus
from pipeline.write.inputs import ReadOptions


def test_round_trip_every_token_once_and_vectors_match_the_model(tiny_model_dir: Path,
                                                                 tmp_path: Path) -> None:
    import elmo_model

    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    summary = embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out, min_items=3,
                                  dtype="float32", batch_tokens=16))
    assert summary.documents == 9 and summary.errors == 0
    # The summary says how much of the run was starting (the model's load, here).
    assert 0 < summary.start_s < summary.elapsed_s
    assert f"{summary.start_s:.1f} s of it starting" in summary.lines()[-2]
    # At least --shards items (a.txt is cut in line-aligned byte ranges).
    assert summary.items_written >= 3
    entries = [json.loads(e.read_text()) for e in (out / "_manifest/main").glob("shard=*.json")]
    assert len(entries) == summary.items_written
    with_tokens = {f"tokens/shard={e['shard']}/main.parquet" for e in entries
                   if e["counts"]["tokens"]}  # an item owning no rows has no files
    assert {str(p.relative_to(out)) for p in out.glob("tokens/*/*")} == with_tokens

    tokens = read_table(out, "tokens").to_pandas()
    assert not tokens.duplicated(["doc_id", "sent_idx", "tok_idx"]).any()
    embedder = elmo_model.load_model_dir(tiny_model_dir)
    docs = {f"a.txt:{i + 1}": t for i, t in enumerate(TEXT_A) if t}
    docs |= {f"b.txt:{i + 1}": t for i, t in enumerate(TEXT_B)}
    docs |= {"j1": "JSON lines work too. Yes.", "j2": "Another record.",
             "p1": "Parquet text.", "p2": "And more of it."}
    assert set(tokens.doc_id) == set(docs)
    # The model's declared tokenizer (whatever name it declares).
    split_sentences = get_tokenizer(model_tokenizer(str(tiny_model_dir / "options.json"))
                                    ).split_sentences
    for doc_id, text in docs.items():
        sentences = split_sentences(text)
        expected = embedder.embed([s.words for s in sentences])
        rows = tokens[tokens.doc_id == doc_id].sort_values(["sent_idx", "tok_idx"])
        assert len(rows) == sum(len(s.tokens) for s in sentences)
        assert list(rows.token) == [w for s in sentences for w in s.words]
        assert all(text[a:b] == t for a, b, t in zip(rows.char_start, rows.char_end, rows.token,
                                                     strict=True))
        assert rows["shard"].nunique() == 1  # a document lives in one work item
        for layer in range(3):
            got = np.stack(rows[f"layer_{layer}"].to_numpy())
            want = np.concatenate([e[layer] for e in expected])
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    documents = read_table(out, "documents").to_pandas().set_index("doc_id")
    assert json.loads(documents.loc["j1", "metadata"]) == {"lang": "en"}
    assert documents.loc["a.txt:3", "line"] == 3
    sentences = read_table(out, "sentences").to_pandas()
    assert len(sentences) == sum(len(split_sentences(t)) for t in docs.values())


def test_long_sentence_goes_through_windows(tiny_model_dir: Path, tmp_path: Path) -> None:
    import elmo_model

    words = [f"w{i % 97}" for i in range(600)]
    (tmp_path / "long.txt").write_text(" ".join(words) + "\n")
    out = tmp_path / "ds"
    embed_corpus(config(tiny_model_dir, [str(tmp_path / "long.txt")], out, min_items=1,
                        dtype="float32", max_sentence_tokens=100, window_overlap=20))
    rows = read_table(out, "tokens").to_pandas().sort_values("tok_idx")
    assert list(rows.tok_idx) == list(range(600)) and set(rows.sent_idx) == {0}
    assert read_table(out, "sentences").column("n_windows").to_pylist() == [8]
    # Token 40 is owned by the first window [0, 100): its vectors are that window's.
    first = elmo_model.load_model_dir(tiny_model_dir).embed([words[:100]])[0]
    np.testing.assert_allclose(np.stack(rows.layer_2.to_numpy()[:50]), first[2, :50],
                               rtol=1e-5, atol=1e-5)


def test_duckdb_reads_the_hive_dataset(tiny_model_dir: Path, tmp_path: Path) -> None:
    import duckdb

    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    summary = embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out, min_items=4,
                                  dtype="float16"))
    con = duckdb.connect()
    rows = con.execute(
        "SELECT shard, doc_id, count(*) AS n, any_value(len(layer_2)) AS dim, "
        "any_value(typeof(layer_1)) AS t "
        "FROM read_parquet(?, hive_partitioning=true) GROUP BY ALL",
        [f"{out}/tokens/*/*.parquet"],
    ).fetchall()
    assert sum(r[2] for r in rows) == summary.tokens
    for _, _, _, dim, type_name in rows:
        assert dim == 16 and type_name == "FLOAT[]"  # float16 widened by DuckDB
    # Every table of a document is in the same shard (its work item): per-shard joins.
    mismatched = con.execute(
        "SELECT count(*) FROM read_parquet(?, hive_partitioning=true) t "
        "JOIN read_parquet(?, hive_partitioning=true) d USING (doc_id) WHERE t.shard <> d.shard",
        [f"{out}/tokens/*/*.parquet", f"{out}/documents/*/*.parquet"],
    ).fetchone()
    assert mismatched == (0,)
    joined = con.execute(
        "SELECT count(*) FROM read_parquet(?, hive_partitioning=true) t "
        "JOIN read_parquet(?, hive_partitioning=true) s USING (doc_id, sent_idx)",
        [f"{out}/tokens/*/*.parquet", f"{out}/sentences/*/*.parquet"],
    ).fetchone()
    assert joined == (summary.tokens,)


def test_items_do_not_depend_on_batching(tiny_model_dir: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    first, second = tmp_path / "one", tmp_path / "two"
    embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], first, min_items=4))
    # Another batch size changes the batches, not which item holds what.
    embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], second, min_items=4, batch_tokens=7))
    a, b = dataset_files(first), dataset_files(second)
    assert a.keys() == b.keys()
    for key in a:
        if key.startswith(("documents", "sentences")):
            assert a[key].equals(b[key])


def test_hostile_corpus(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    long_token = "z" * 1000
    good = ["A normal line.", "Control\x00chars\x07 and\x1b inside.", f"A {long_token} token.",
            " ".join(f"t{i}" for i in range(10_000))]
    (corpus / "text.txt").write_bytes(
        "\n".join(good).encode() + b"\nbad \xff\xfe utf8 here\n\n   \n")
    (corpus / "records.jsonl").write_text("\n".join([
        json.dumps({"id": "ok", "text": "Fine record."}),
        json.dumps({"id": "empty", "text": ""}),
        json.dumps({"id": "blank", "text": "  \t "}),
        json.dumps({"id": "num", "text": 42}),
        '{"id": "broken", "text": ',
        json.dumps({"id": "surrogate", "text": "\ud800 lone"}),
        json.dumps({"id": "notext"}),
        json.dumps({"id": "ok", "text": "Duplicate id."}),
    ]))
    (corpus / "random.bin").write_bytes(np.random.default_rng(0).bytes(4096))
    (corpus / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    (corpus / "empty.txt").write_bytes(b"")
    out = tmp_path / "ds"
    code = run_cli(monkeypatch, ["embed", f"{corpus}/*", "--out", str(out), "--model",
                                 str(tiny_model_dir), "--shards", "2", "--no-progress",
                                 "--executor", "local"])
    assert code == 0
    report = capsys.readouterr().err
    assert "embedded 5 documents" in report and "11 bad inputs" in report

    errors = read_table(out, "errors").to_pandas().set_index("doc_id")["reason"].to_dict()
    assert errors == {
        "text.txt:5": "invalid UTF-8 at byte 4",
        "empty": "empty document",
        "blank": "empty document",
        "num": "text is int, not a string",
        "records.jsonl:5": errors["records.jsonl:5"],
        "surrogate": "text contains unpaired surrogate code points",
        "notext": "no 'text' field",
        "random.bin": "binary file (not text)",
        "image.png": "binary file (not text)",
        "empty.txt": "empty file",
        "ok": "duplicate doc_id",  # the second record with that id; the first is stored
    }
    assert errors["records.jsonl:5"].startswith("invalid JSON")
    tokens = read_table(out, "tokens").to_pandas()
    assert set(tokens.doc_id) == {"text.txt:1", "text.txt:2", "text.txt:3", "text.txt:4", "ok"}
    assert long_token in set(tokens.token)  # stored whole, truncated only for the char ids
    assert (tokens.doc_id == "text.txt:4").sum() == 10_000
    assert list(tokens[tokens.doc_id == "text.txt:2"].sort_values("tok_idx").token) == [
        "Control", "chars", "and", "inside", "."]


def test_nothing_processable_exits_1(tiny_model_dir: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "junk.bin").write_bytes(b"\x00\x01\x02" * 100)
    code = run_cli(monkeypatch, ["embed", str(tmp_path / "junk.bin"), "--out",
                                 str(tmp_path / "ds"), "--model", str(tiny_model_dir),
                                 "--no-progress"])
    assert code == 1
    assert read_table(tmp_path / "ds", "errors").num_rows == 1


def test_user_errors_are_one_line(tiny_model_dir: Path, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(monkeypatch, ["embed", str(tmp_path / "nothing-*.txt"), "--out",
                                 str(tmp_path / "ds"), "--model", str(tiny_model_dir)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("elmo: error: no input files match") and "\n" not in err
    assert run_cli(monkeypatch, ["embed", "x", "--out", "y", "--model",
                                 str(tmp_path / "no-model")]) == 2


def test_refuses_a_dataset_of_another_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch

    from elmo_model import BiLM, BiLMConfig, save_model_dir

    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], out, min_items=2))
    torch.manual_seed(1)
    other = save_model_dir(BiLM(BiLMConfig(n_layers=1, lstm_dim=16, projection_dim=4,
                                           char_embedding_dim=4, filters=((1, 4),),
                                           n_highway=0)), tmp_path / "other")
    with pytest.raises(ElmoUserError, match="another model"):
        embed_corpus(config(other, [f"{corpus}/*.txt"], out, min_items=2))
    with pytest.raises(ElmoUserError, match="dtype"):
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], out, min_items=2,
                            dtype="float32"))
    # Same dataset, other inputs: refused rather than silently mixed.
    with pytest.raises(ElmoUserError, match="other inputs"):
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out, min_items=2))
    # Same command again: everything is committed already; no work, same totals.
    again = embed_corpus(config(tiny_model_dir, [f"{corpus}/*.txt"], out, min_items=2))
    assert again.items_written == 0 and again.items_resumed >= 2
    assert again.documents_resumed == 5 and again.totals["documents"] == 5
    assert again.lines()[0].startswith(f"resumed: {again.items_resumed} items committed by "
                                       "an earlier run kept (5 documents, ")


def test_lock_refuses_a_live_writer_and_takes_over_a_dead_one(tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    import socket

    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = {"host": socket.gethostname(), "pid": sleeper.pid, "token": "x",
                  "heartbeat": time.time()}
        (out / "_lock").write_text(json.dumps(record))
        with pytest.raises(ElmoUserError, match="being written by another run"):
            embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out))
    finally:
        sleeper.kill()
        sleeper.wait()
    # The owner is dead now: the lock is stale and the run proceeds.
    summary = embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out))
    assert summary.documents == 9 and not (out / "_lock").exists()


def _big_corpus(folder: Path, n_lines: int = 2000) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(7)
    text = [" ".join(rng.choice(["alpha", "beta", "gamma.", "Delta", "eps,"], 12)) + f" n{i}."
            for i in range(n_lines)]
    (folder / "big.txt").write_text("\n".join(text) + "\n")
    return folder


@pytest.mark.slow
def test_kill_9_mid_run_then_rerun_equals_an_uninterrupted_run(tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    corpus = _big_corpus(tmp_path / "corpus")
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    args = ["embed", f"{corpus}/*.txt", "--model", str(tiny_model_dir), "--shards", "16",
            "--no-progress", "--executor", "local"]
    program = ("import sys; from pipeline import cli; cli.REGISTRARS = ('pipeline.embed_cli',); "
               "sys.exit(cli.main(sys.argv[1:]))")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-c", program, *args, "--out", str(clean)], check=True,
                   env=env, capture_output=True)

    proc = subprocess.Popen([sys.executable, "-c", program, *args, "--out", str(crashed)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest = crashed / "_manifest" / "main"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(manifest.glob("shard=*.json"))) >= 3:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    committed = len(list(manifest.glob("shard=*.json")))
    assert 3 <= committed < 16, f"the kill came too late ({committed} shards committed)"
    assert (crashed / "_lock").exists()  # a dead owner's lock, left behind

    rerun = subprocess.run([sys.executable, "-c", program, *args, "--out", str(crashed)],
                           env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed: {committed} items committed by an earlier run kept" in rerun.stderr
    a, b = dataset_files(clean), dataset_files(crashed)
    # 16 shards x tokens/types/sentences/documents; no errors, so no errors files.
    assert a.keys() == b.keys() and len(a) == 64
    for key in a:
        assert a[key].equals(b[key]), key
    assert not (crashed / "_lock").exists() and not (crashed / "_staging").exists()


def test_pretokenized_input_keeps_the_given_tokens(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "tok.txt").write_text("The cat ca n't sit .\nU.S.A. is big\n")
    (tmp_path / "tok.jsonl").write_text(json.dumps(
        {"id": "x", "tokens": [["Hello", "world"], ["Second", "one", "!"]]}) + "\n")
    out = tmp_path / "ds"
    embed_corpus(config(tiny_model_dir, [f"{tmp_path}/tok.*"], out, min_items=1,
                        read=ReadOptions(pretokenized=True)))
    tokens = read_table(out, "tokens").to_pandas().sort_values(["doc_id", "sent_idx", "tok_idx"])
    got = tokens.groupby(["doc_id", "sent_idx"], sort=True).token.apply(list).to_dict()
    assert got == {("tok.txt:1", 0): ["The", "cat", "ca", "n't", "sit", "."],
                   ("tok.txt:2", 0): ["U.S.A.", "is", "big"],
                   ("x", 0): ["Hello", "world"], ("x", 1): ["Second", "one", "!"]}
    texts = read_table(out, "sentences").to_pandas().set_index(["doc_id", "sent_idx"]).text
    assert texts[("x", 1)] == "Second one !"


def test_the_local_executor_gives_its_model_the_cores_the_other_items_leave(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's threads while a local run embeds on the CPU: the cores less one per other
    item in flight (at least 1); torch's own setting is back once the run closes."""
    import torch

    from pipeline.write import executors

    monkeypatch.setattr(executors.os, "sched_getaffinity", lambda pid: set(range(16)),
                        raising=False)
    assert [executors.local_model_threads(n) for n in (1, 2, 4)] == [16, 15, 13]
    monkeypatch.setattr(executors.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert [executors.local_model_threads(n) for n in (1, 2, 4)] == [2, 1, 1]
    seen = []
    worker_load = executors.ItemWorker.load
    monkeypatch.setattr(executors.ItemWorker, "load",
                        lambda self: (seen.append(torch.get_num_threads()), worker_load(self)))
    before = torch.get_num_threads()
    corpus = write_corpus(tmp_path / "corpus")
    embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], tmp_path / "out", device="cpu"))
    assert seen and all(threads == 1 for threads in seen)
    assert torch.get_num_threads() == before
