"""Incremental job runs on a real dataset (tiny random model, in-process executor).

Add a file -> only it is embedded; modify one -> its rows replaced, others untouched;
delete -> rows removed when configured; nothing changed -> no model work; kill -9 at
several points -> the next run completes and equals a clean run; index refresh deltas.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers import REPO

import pipeline
from jobs.runner import run_job
from jobs.spec import JobSpec, load_spec
from jobs.state import iter_runs, live_files

KEYS = {"tokens": ["doc_id", "sent_idx", "tok_idx"], "sentences": ["doc_id", "sent_idx"],
        "documents": ["doc_id"], "errors": ["doc_id", "reason"]}


def write_spec(folder: Path, model: Path, **extra: Any) -> Path:
    lines = ['source = "corpus/**/*.txt"', 'output = "ds"', f'model = "{model}"', "shards = 2",
             'dtype = "float32"', 'schedule = "0 0 1 1 *"']
    lines += [f"{key} = {value}" for key, value in extra.items()]
    path = folder / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_corpus(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / "corpus" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


INITIAL = {"a.txt": "The cat sat on the mat.\nA dog ran home fast.\n",
           "sub/b.txt": "Hello world. Again here.\n"}
FINAL = {"a.txt": INITIAL["a.txt"], "sub/b.txt": "Changed text now. With three sentences. Yes.\n",
         "c.txt": "A new file arrives.\n", "d.txt": "Another one, later.\n"}


def live(spec: JobSpec, table: str) -> pa.Table:
    rows = pipeline.open_dataset(spec.output).to_table(table=table)
    return rows.sort_by([(k, "ascending") for k in KEYS[table]])


def on_disk_is_live(out: Path) -> bool:
    """A plain directory scan finds exactly the live files: no old version left behind."""
    on_disk = {str(p) for p in (out / "tokens").rglob("*.parquet")}
    return on_disk == {f.removeprefix("file://") for f in live_files(str(out))}


def doc_ids(spec: JobSpec) -> set[str]:
    return set(live(spec, "documents").column("doc_id").to_pylist())


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The files (URIs) of every embedding call the runner makes."""
    import jobs.runner

    calls: list[list[str]] = []
    real = jobs.runner.embed_corpus

    def wrapped(cfg: Any) -> Any:
        calls.append([s.uri for s in cfg.select_sources()])
        return real(cfg)

    monkeypatch.setattr(jobs.runner, "embed_corpus", wrapped)
    return calls


def bump_mtime(path: Path) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))


def test_add_modify_touch_delete(tiny_model_dir: Path, tmp_path: Path,
                                 spy: list[list[str]]) -> None:
    write_corpus(tmp_path, INITIAL)
    spec = load_spec(write_spec(tmp_path, tiny_model_dir))
    first = run_job(spec)
    assert first is not None and first.record.status == "ok"
    assert first.record.files["new"] == 2 and first.record.documents == 3
    assert doc_ids(spec) == {"a.txt:1", "a.txt:2", "sub/b.txt:1"}  # ids as `elmo embed` makes
    assert len(spy) == 2

    # Nothing changed: no embedding call at all, and the run says so.
    spy.clear()
    again = run_job(spec)
    assert again is not None and again.record.status == "no-changes" and spy == []
    assert any("no model work" in line for line in again.lines)

    # A touched file (new mtime, same bytes) is not re-embedded either.
    bump_mtime(tmp_path / "corpus/a.txt")
    touched = run_job(spec)
    assert touched is not None and touched.record.files["touched"] == 1 and spy == []

    # Add a file: only it is embedded, and no existing file is rewritten.
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "ds/tokens").rglob("*.parquet")}
    tokens_before = live(spec, "tokens")
    write_corpus(tmp_path, {"c.txt": FINAL["c.txt"]})
    added = run_job(spec)
    assert added is not None and added.record.files["new"] == 1 and len(spy) == 1
    assert spy[0] == [f"file://{tmp_path}/corpus/c.txt"]  # that one file alone
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())
    assert doc_ids(spec) == {"a.txt:1", "a.txt:2", "sub/b.txt:1", "c.txt:1"}

    # Modify b: its rows are replaced (no old row left, no duplicate), others untouched.
    spy.clear()
    write_corpus(tmp_path, {"sub/b.txt": FINAL["sub/b.txt"]})
    bump_mtime(tmp_path / "corpus/sub/b.txt")
    changed = run_job(spec)
    assert changed is not None and changed.record.files["changed"] == 1 and len(spy) == 1
    tokens = live(spec, "tokens")
    b_rows = tokens.filter(pa.compute.equal(tokens.column("doc_id"), "sub/b.txt:1"))
    assert b_rows.column("token").to_pylist()[:3] == ["Changed", "text", "now"]
    assert b_rows.num_rows == 10
    others = tokens.filter(pa.compute.not_equal(tokens.column("doc_id"), "sub/b.txt:1"))
    old_others = tokens_before.filter(
        pa.compute.not_equal(tokens_before.column("doc_id"), "sub/b.txt:1"))
    assert others.filter(pa.compute.not_equal(others.column("doc_id"), "c.txt:1")).equals(
        old_others)
    # The old part is gone from disk too: a plain directory scan sees one version.
    assert on_disk_is_live(tmp_path / "ds")

    # Delete a: kept while delete_missing is false, removed once it is true.
    (tmp_path / "corpus/a.txt").unlink()
    kept = run_job(spec)
    assert kept is not None and kept.record.status == "no-changes"
    assert kept.record.files["missing_kept"] == 1 and "a.txt:1" in doc_ids(spec)
    spec = load_spec(write_spec(tmp_path, tiny_model_dir, delete_missing="true"))
    spy.clear()
    deleted = run_job(spec)
    assert deleted is not None and deleted.record.files["deleted"] == 1 and spy == []
    assert doc_ids(spec) == {"sub/b.txt:1", "c.txt:1"}
    assert on_disk_is_live(tmp_path / "ds")

    history = list(iter_runs(*_fs(spec)))
    assert [r.status for r in history] == ["ok", "no-changes", "no-changes", "ok", "ok",
                                           "no-changes", "ok"]
    assert all(r.ended_at is not None and r.ended_at >= r.started_at for r in history)


def _fs(spec: JobSpec) -> tuple[Any, str]:
    from schemas.files import open_fs

    return open_fs(spec.output)


CRASHER = textwrap.dedent("""
    import os, signal, sys
    import pipeline.write.embed, jobs.runner
    from jobs.spec import load_spec
    from jobs.runner import run_job

    mode = sys.argv[2]
    calls = {"embed": 0, "commit": 0}
    real_embed, real_commit = jobs.runner.embed_corpus, pipeline.write.embed.commit_item
    real_refresh = jobs.runner._refresh

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def embed(cfg):
        calls["embed"] += 1
        calls["commit"] = 0
        summary = real_embed(cfg)
        if mode == "after-part" and calls["embed"] == 2:
            die()
        return summary

    def commit(*args, **kwargs):
        entry = real_commit(*args, **kwargs)
        calls["commit"] += 1
        if mode == "mid-part" and calls["embed"] == 2 and calls["commit"] == 1:
            die()  # the 2nd file's part has one of its (at least two) items committed
        return entry

    def refresh(*args, **kwargs):
        die()  # after the state switch, before old parts are deleted

    real_write_state = jobs.runner.write_state

    def write_state(*args, **kwargs):
        real_write_state(*args, **kwargs)
        if mode == "after-state":
            die()  # state.json switched, _live.json (what readers follow) not yet

    jobs.runner.embed_corpus = embed
    jobs.runner.write_state = write_state
    pipeline.write.embed.commit_item = commit
    jobs.runner._refresh = refresh
    run_job(load_spec(sys.argv[1]))
    print("finished without being killed")
""")


@pytest.fixture(scope="module")
def clean_final(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[Path, dict[str, pa.Table]]:
    """A clean, uninterrupted run over the final corpus: what every crash must end in."""
    folder = tmp_path_factory.mktemp("clean")
    write_corpus(folder, FINAL)
    spec = load_spec(write_spec(folder, tiny_model_dir))
    run_job(spec)
    return folder, {t: live(spec, t) for t in KEYS}


def reader_views(spec: JobSpec) -> dict[str, Any]:
    """What the other readers see: DuckDB's views and Dataset.shard_files (the index's)."""
    from pipeline.lookup.sql import connect
    from schemas.dataset import open_dataset

    con = connect(spec.output)
    try:
        rows = con.sql("SELECT doc_id, sent_idx, tok_idx, token FROM tokens "
                       "ORDER BY doc_id, sent_idx, tok_idx").fetchall()
        docs = con.sql("SELECT doc_id FROM documents ORDER BY doc_id").fetchall()
    finally:
        con.close()
    parts = {key.split("/")[0] for key, _ in open_dataset(spec.output).shard_files("tokens")}
    return {"rows": rows, "docs": docs, "parts": parts}


def expected_views(tables: dict[str, pa.Table]) -> dict[str, Any]:
    tokens = tables["tokens"].sort_by([(k, "ascending") for k in ("doc_id", "sent_idx",
                                                                   "tok_idx")])
    return {"rows": list(zip(*(tokens.column(c).to_pylist() for c in (
                "doc_id", "sent_idx", "tok_idx", "token")), strict=True)),
            "docs": [(d,) for d in sorted(tables["documents"].column("doc_id").to_pylist())]}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["mid-part", "after-part", "after-state", "after-switch"])
def test_kill_9_during_a_run_then_rerun_equals_a_clean_run(
        tiny_model_dir: Path, clean_final: tuple[Path, dict[str, pa.Table]], mode: str) -> None:
    clean_folder, clean = clean_final
    # The same corpus files (URIs are part of the part names), a fresh output.
    folder = clean_folder / f"crash-{mode}"
    folder.mkdir()
    spec_path = write_spec(folder, tiny_model_dir)
    spec_path.write_text(spec_path.read_text().replace(
        '"corpus/**/*.txt"', f'"{clean_folder}/corpus/**/*.txt"'))
    spec = load_spec(spec_path)
    # Start from the initial corpus version: a, old b (b is modified later by moving
    # the clean corpus's file aside and back).
    b_final = clean_folder / "corpus/sub/b.txt"
    hidden = {p: p.read_bytes() for p in (clean_folder / "corpus").rglob("*.txt")}
    try:
        for name in ("c.txt", "d.txt"):
            (clean_folder / "corpus" / name).unlink()
        b_final.write_text(INITIAL["sub/b.txt"])
        run_job(spec)
        before = {t: live(spec, t) for t in KEYS}
    finally:
        for path, data in hidden.items():
            path.write_bytes(data)
        bump_mtime(b_final)

    proc = subprocess.run([sys.executable, "-c", CRASHER, str(spec_path), mode], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    after_crash = {t: live(spec, t) for t in KEYS}
    views = reader_views(spec)
    live_now = {s["part"] for s in json.loads((Path(spec.output) / "_live.json").read_text())[
        "shards"]}
    if mode == "after-switch":
        assert after_crash == clean  # the switch happened: readers see the new version
        assert {k: views[k] for k in ("rows", "docs")} == expected_views(clean)
    else:
        assert after_crash == before  # readers still see the old version, entirely
        assert {k: views[k] for k in ("rows", "docs")} == expected_views(before)
    # Parts built but not switched to yet are on disk, and invisible to every reader.
    assert views["parts"] == live_now
    on_disk = {p.stem for p in (Path(spec.output) / "tokens").rglob("*.parquet")}
    assert on_disk >= live_now and (mode == "after-switch" or on_disk > live_now)
    assert [r.status for r in iter_runs(*_fs(spec))] == ["ok", "running"]

    result = run_job(spec)
    assert result is not None
    assert {t: live(spec, t) for t in KEYS} == clean
    assert [r.status for r in iter_runs(*_fs(spec))] == ["ok", "crashed", result.record.status]
    # No leftovers: the files on disk are exactly a clean run's files.
    out, clean_out = Path(spec.output), clean_folder / "ds"
    assert sorted(p.relative_to(out) for p in out.glob("*/shard=*/*.parquet")) == sorted(
        p.relative_to(clean_out) for p in clean_out.glob("*/shard=*/*.parquet"))


@pytest.mark.slow
def test_index_refresh_gets_deltas_and_is_retried_after_a_failure(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """The real LanceDB index follows the live view by deltas; a refresh that fails (the
    index location unusable) is completed by the next run."""
    from pipeline.lookup.index.sense_index import SenseIndex

    def index_matches_live(index_uri: str) -> bool:
        keys = ["doc_id", "sent_idx", "tok_idx", "token"]
        rows = SenseIndex(index_uri).table.search().select(keys).limit(10_000).to_arrow()
        return rows.sort_by([(k, "ascending") for k in keys]).to_pylist() == \
            live(spec, "tokens").select(keys).to_pylist()

    write_corpus(tmp_path, INITIAL)
    spec = load_spec(write_spec(tmp_path, tiny_model_dir, mixes='["top"]'))
    index_uri = spec.index_uri("top")
    assert index_uri == str(tmp_path / "ds/_index/top")
    first = run_job(spec)
    assert first is not None and first.record.index["top"].startswith(
        f"refreshed: +{len(live_files(spec.output))} files, -0 documents")
    assert index_matches_live(index_uri)

    write_corpus(tmp_path, {"sub/b.txt": FINAL["sub/b.txt"]})
    bump_mtime(tmp_path / "corpus/sub/b.txt")
    index_dir = Path(index_uri)
    index_dir.rename(index_dir.with_name("top.away"))
    index_dir.write_text("not a LanceDB database")  # the index location is unusable
    failed = run_job(spec)
    assert failed is not None and failed.exit_code == 1
    assert failed.record.index["top"].startswith("failed: ")
    # The index still holds b's old rows: the old part stays on disk (not live) until the
    # index has dropped them.
    on_disk = {str(p) for p in (tmp_path / "ds/tokens").rglob("*.parquet")}
    extra = on_disk - {f.removeprefix("file://") for f in live_files(spec.output)}
    assert extra and len({Path(f).stem for f in extra}) == 1  # b's old part, nothing else

    index_dir.unlink()
    index_dir.with_name("top.away").rename(index_dir)
    retried = run_job(spec)
    assert retried is not None and retried.record.status == "no-changes"
    # Only the new part's file was added, and b's one old document deleted.
    assert retried.record.index["top"].startswith("refreshed: +1 files, -1 documents")
    assert index_matches_live(index_uri)
    assert on_disk_is_live(tmp_path / "ds")
    assert run_job(spec).record.index["top"] == "up to date"  # type: ignore[union-attr]


SLOW_SCHEDULER = textwrap.dedent("""
    import sys, time
    import pipeline.write.embed
    from jobs.spec import load_spec
    from jobs.schedule import schedule_loop

    real = pipeline.write.embed.embed_corpus
    def slow(cfg):
        time.sleep(float(sys.argv[2]))
        return real(cfg)
    pipeline.write.embed.embed_corpus = slow
    outcome = schedule_loop([load_spec(sys.argv[1])], once=True, echo=False)
    print("OUTCOME", list(outcome.values())[0])
""")


@pytest.mark.slow
def test_two_schedulers_on_one_spec_run_one_at_a_time(tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    from jobs.schedule import tick

    write_corpus(tmp_path, INITIAL)
    spec_path = write_spec(tmp_path, tiny_model_dir)  # yearly cron: due, never ran
    spec = load_spec(spec_path)
    procs = [subprocess.Popen([sys.executable, "-c", SLOW_SCHEDULER, str(spec_path), "2"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    lock = tmp_path / "ds/_jobs/_lock"
    deadline = time.monotonic() + 120
    while not lock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lock.exists(), "no scheduler took the job lock"
    # While a run is going, a third scheduler here skips (or sees the slot taken).
    assert tick([spec], time.time, echo=False)[spec.name] in (
        "skipped: the previous run is still going", "not due")
    outs = [p.communicate(timeout=240) for p in procs]
    outcomes = sorted(o.split("OUTCOME ", 1)[1].strip() for o, _ in outs)
    assert outcomes.count("ok") == 1, outs
    assert set(outcomes) <= {"ok", "not due", "served by another scheduler",
                             "skipped: the previous run is still going"}
    runs = list(iter_runs(*_fs(spec)))
    assert [r.status for r in runs] == ["ok"] and runs[0].trigger == "schedule"
    assert tick([spec], time.time, echo=False)[spec.name] == "not due"


def test_cli_run_status_and_busy(tiny_model_dir: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture) -> None:
    import json

    from pipeline import cli
    from schemas.lock import DatasetLock

    monkeypatch.setattr(cli, "REGISTRARS", ("jobs.cli",))  # only our verbs
    write_corpus(tmp_path, INITIAL)
    spec_path = str(write_spec(tmp_path, tiny_model_dir))
    assert cli.main(["jobs", "run", spec_path]) == 0
    assert "2 new, 0 changed" in capsys.readouterr().err
    assert cli.main(["jobs", "run", spec_path]) == 0
    assert "no changes (2 files unchanged); no model work done" in capsys.readouterr().err

    assert cli.main(["jobs", "status", spec_path]) == 0
    out = capsys.readouterr().out
    from jobs.schedule import fmt_time, next_slot

    yearly = fmt_time(next_slot(load_spec(spec_path), time.time()))
    assert "job  schedule: 0 0 1 1 * (UTC)" in out and f"next due: {yearly}" in out
    assert "no-changes" in out and "ok" in out
    assert cli.main(["jobs", "status", spec_path, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)[0]
    assert status["job"] == "job" and [r["status"] for r in status["runs"]] == ["ok",
                                                                                "no-changes"]

    from schemas.files import open_fs

    fs, root = open_fs(str(tmp_path / "ds"))
    with DatasetLock(fs, f"{root}/_jobs"):  # as if another run were going
        assert cli.main(["jobs", "run", spec_path]) == 2
    assert "in use by another run of this job" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("compact", [None, False, True])
def test_index_refresh_with_the_lookup_layers_build_index(tiny_model_dir: Path,
                                                           tmp_path: Path,
                                                           compact: bool | None) -> None:
    """The real LanceDB index follows the live view: a changed file's rows replaced; a
    compact index (``index_compact``, or a new index without it) ranks with the changed
    dataset's vectors."""
    import lancedb

    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.layers.mixes import iter_mixed
    from schemas.dataset import open_dataset

    write_corpus(tmp_path, INITIAL)
    given = {} if compact is None else {"index_compact": str(compact).lower()}
    spec = load_spec(write_spec(tmp_path, tiny_model_dir, mixes='["top"]', **given))
    assert spec.index_compact is compact
    assert run_job(spec).record.index["top"].startswith("refreshed")  # type: ignore[union-attr]
    assert SenseIndex(spec.index_uri("top")).meta.compact is (compact is not False)

    def index_rows() -> list[tuple]:
        table = lancedb.connect(spec.index_uri("top")).open_table("tokens").to_arrow()
        return sorted(zip(*(table.column(c).to_pylist()
                            for c in ("doc_id", "sent_idx", "tok_idx", "token")), strict=True))

    def live_rows() -> list[tuple]:
        t = live(spec, "tokens")
        return sorted(zip(*(t.column(c).to_pylist()
                            for c in ("doc_id", "sent_idx", "tok_idx", "token")), strict=True))

    assert index_rows() == live_rows()
    write_corpus(tmp_path, {"sub/b.txt": FINAL["sub/b.txt"], "c.txt": FINAL["c.txt"]})
    bump_mtime(tmp_path / "corpus/sub/b.txt")
    result = run_job(spec)
    assert result is not None and result.exit_code == 0, result.lines
    assert index_rows() == live_rows()  # old b rows gone, new b and c rows in, no duplicates
    # Each live token's own vector finds it first (the compact index reads them anew).
    ds = open_dataset(spec.output)
    index = SenseIndex(spec.index_uri("top"))
    for batch, vec in iter_mixed(ds, ds.mix("top"), columns=("doc_id", "sent_idx", "tok_idx")):
        for i in range(0, batch.num_rows, 7):
            hit = index.search(vec[i], k=1, exact=True, columns=["doc_id", "sent_idx",
                                                                   "tok_idx"]).to_pylist()[0]
            assert 1 - hit.pop("_distance") > 0.999


def test_the_spec_tokenizer_is_the_datasets(tiny_model_dir: Path, tmp_path: Path) -> None:
    from pipeline.tokenize import model_tokenizer, tokenizer_names

    declared = model_tokenizer(str(tiny_model_dir / "options.json"))
    other = next(n for n in tokenizer_names() if n != declared)
    write_corpus(tmp_path, INITIAL)
    spec = load_spec(write_spec(tmp_path, tiny_model_dir, tokenizer=f'"{other}"'))
    result = run_job(spec)
    assert result is not None and result.exit_code == 0
    descriptor = json.loads((tmp_path / "ds/_dataset.json").read_text())
    assert descriptor["tokenizer"]["name"] == other
    assert doc_ids(spec) == {"a.txt:1", "a.txt:2", "sub/b.txt:1"}


def test_a_job_reads_pretokenized_input_from_its_tokens_column(tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    """``read.tokens_column``: the job embeds the token lists of that field, as
    ``elmo embed --pretokenized --tokens-column words`` does (the key did not exist)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text(json.dumps(
        {"id": "x", "words": [["Hello", "world"], ["Second", "one", "!"]],
         "tokens": [["not", "these"]]}) + "\n")
    path = tmp_path / "job.toml"
    path.write_text(f'source = "corpus/*.jsonl"\noutput = "ds"\nmodel = "{tiny_model_dir}"\n'
                    'shards = 1\n[read]\npretokenized = true\ntokens_column = "words"\n')
    spec = load_spec(path)
    assert spec.embed_config().read.tokens_column == "words"
    result = run_job(spec)
    assert result is not None and result.record.status == "ok"
    tokens = live(spec, "tokens").to_pandas()
    got = tokens.groupby(["doc_id", "sent_idx"], sort=True).token.apply(list).to_dict()
    assert got == {("x", 0): ["Hello", "world"], ("x", 1): ["Second", "one", "!"]}
