"""The fault suite of the dataset's writers and readers (issue 50): concurrent derived-table
writers, a byte that rots after its file was checked, a full disk, missing inputs.

Every probe runs the real thing: `elmo` processes, DuckDB, Parquet files on disk, a real
tmpfs for the full disk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import REPO, flip_keeping_mtime, layer_page_offset

from elmo_model.errors import ElmoUserError
from pipeline.write.embed import EmbedConfig, ModelSpec, embed_corpus

CORPUS = REPO / "examples" / "corpus" / "shakespeare_play.txt"
# Words with at least a few uses each in CORPUS, two disjoint lists of 18.
WORDS_A = ["the", "and", "to", "of", "a", "my", "you", "is", "in", "that", "not", "me",
           "it", "with", "be", "your", "this", "his"]
WORDS_B = ["i", "for", "he", "what", "but", "have", "will", "so", "thou", "all", "our",
           "by", "do", "we", "as", "no", "are", "him"]


def _embed(sources: list[str], out: Path, **kw: object) -> object:
    return embed_corpus(EmbedConfig(sources=sources, out=str(out),
                                    model=ModelSpec.resolve(str(REPO / "models" / "default")),
                                    min_items=2, progress=False, executor="local", **kw))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(dataset, its flat index), built once; tests that change them copy them."""
    from pipeline.lookup.index.build import build_index

    folder = tmp_path_factory.mktemp("faults")
    _embed([str(CORPUS)], folder / "ds")
    build_index(str(folder / "ds"), "top", str(folder / "ix"), kind="flat", compact=False)
    return folder / "ds", str(folder / "ix")


def _copy(built: tuple[Path, str], tmp_path: Path) -> tuple[Path, str]:
    """A copy of the dataset and an index that points at the copy."""
    from pipeline.lookup.index.build import build_index

    ds = tmp_path / "ds"
    shutil.copytree(built[0], ds)
    build_index(str(ds), "top", str(tmp_path / "ix"), kind="flat", compact=False)
    return ds, str(tmp_path / "ix")


def _elmo(*argv: str, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=600, **kw)


# --------------------------------------------------------------------------- derived writers


@pytest.mark.slow
def test_concurrent_label_runs_lose_no_update(built: tuple[Path, str], tmp_path: Path) -> None:
    """Three `elmo senses label` processes at once, 18 words each (two of them the same
    words): every word is listed once, every listed file exists and matches, no file is
    left unlisted, and queries of every table answer."""
    ds, index = _copy(built, tmp_path)
    runs = [WORDS_A, WORDS_B, WORDS_A[::-1]]
    procs = [subprocess.Popen([sys.executable, "-m", "pipeline.cli", "senses", "label", *words,
                               "--index", index, "--k", "2"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for words in runs]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    registry = json.loads((ds / "_derived.json").read_text())
    entries = registry["tables"]["senses"]
    assert sorted(entries) == sorted(set(WORDS_A + WORDS_B))
    assert registry["generation"] == sum(len(w) for w in runs)  # no update lost
    for word, entry in entries.items():
        table = pq.read_table(ds / entry["path"])
        assert table.num_rows == entry["rows"] and set(table["word"].to_pylist()) == {word}
    listed = {entry["path"] for entry in entries.values()}
    on_disk = {str(p.relative_to(ds)) for p in (ds / "derived" / "senses").iterdir()}
    assert on_disk == listed
    assert not (ds / "_derived.lock").exists()
    verify = _elmo("dataset", "verify", str(ds), "--no-progress")
    assert verify.returncode == 0 and "all match" in verify.stdout, verify.stdout
    count = _elmo("sql", str(ds), "SELECT count(DISTINCT word) AS n FROM senses",
                  "--format", "json")
    assert count.returncode == 0 and json.loads(count.stdout) == {"n": 36}, count.stderr


@pytest.mark.slow
def test_a_lost_derived_file_is_named_with_its_fix_and_other_tables_still_answer(
        built: tuple[Path, str], tmp_path: Path) -> None:
    from pipeline.lookup.senses.labels import label_words
    from pipeline.lookup.sql import run_query

    ds, index = _copy(built, tmp_path)
    label_words(index, ["the", "and"], k=2)
    tokens = run_query(str(ds), "SELECT count(*) AS n FROM tokens").to_pylist()
    entries = json.loads((ds / "_derived.json").read_text())["tables"]["senses"]
    (ds / entries["and"]["path"]).unlink()  # what a lost registry update used to leave
    # A file under derived/ that the registry does not list: a writer killed mid-update.
    orphan = ds / "derived" / "senses" / f"of-{uuid.uuid4().hex[:12]}.parquet"
    shutil.copy(ds / entries["the"]["path"], orphan)

    verify = _elmo("dataset", "verify", str(ds), "--no-progress")
    assert verify.returncode == 1
    assert f"missing: {entries['and']['path']}" in verify.stdout
    assert "`elmo senses label and --index INDEX`" in verify.stdout
    assert "--repair" not in verify.stdout
    assert "1 file(s) under derived/ that _derived.json does not list" in verify.stdout
    # Queries of other tables answer, in the CLI and the API ...
    cli = _elmo("sql", str(ds), "SELECT count(*) AS n FROM tokens", "--format", "json")
    assert cli.returncode == 0 and json.loads(cli.stdout) == tokens[0], cli.stderr
    assert run_query(str(ds), "SELECT count(*) AS n FROM tokens").to_pylist() == tokens
    # ... and one of the damaged table fails with one line naming the fix.
    senses = _elmo("sql", str(ds), "SELECT count(*) FROM senses")
    assert senses.returncode == 2 and len(senses.stderr.strip().splitlines()) == 1
    assert "elmo senses label and --index INDEX" in senses.stderr
    with pytest.raises(ElmoUserError, match="elmo senses label and"):
        run_query(str(ds), "SELECT count(*) FROM senses", check="none")
    # Relabelling mends it, and the update removes the orphan.
    label_words(index, ["and"], k=2)
    assert not orphan.exists()
    assert _elmo("dataset", "verify", str(ds), "--no-progress").returncode == 0
    assert run_query(str(ds), "SELECT count(DISTINCT word) AS n FROM senses").to_pylist() \
        == [{"n": 2}]


@pytest.mark.slow
def test_a_writer_killed_holding_the_registry_lock_does_not_block_the_next(
        built: tuple[Path, str], tmp_path: Path) -> None:
    """A dead owner's ``_derived.lock`` is taken over (its process is gone)."""
    from pipeline.lookup.senses.labels import label_words

    ds, index = _copy(built, tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (ds / "_derived.lock").write_text(json.dumps({
        "host": os.uname().nodename, "pid": int(dead.stdout), "token": "dead",
        "heartbeat": 0}))
    assert [d.word for d in label_words(index, ["the"], k=2)] == ["the"]
    assert not (ds / "_derived.lock").exists()


# --------------------------------------------------------------------------- rot


@pytest.mark.slow
def test_a_byte_flipped_after_a_first_check_is_caught(built: tuple[Path, str],
                                                      tmp_path: Path) -> None:
    import pipeline
    from schemas.manifest import list_files

    ds = tmp_path / "ds"
    shutil.copytree(built[0], ds)
    query = "SELECT sum(list_sum(layer_2)) AS s FROM tokens"
    first = _elmo("sql", str(ds), query, "--format", "json")
    assert first.returncode == 0, first.stderr  # checked once: the version is remembered
    api = pipeline.open_dataset(str(ds)).sql(query).arrow().read_all().to_pylist()
    assert json.loads(first.stdout) == api[0]
    fs_root = pipeline.open_dataset(str(ds)).stored
    target = Path(list_files(fs_root.fs, fs_root.root, "tokens")[0].path)
    flip_keeping_mtime(target, layer_page_offset(target, "layer_2"))

    again = _elmo("sql", str(ds), query, "--format", "json")
    assert again.returncode == 2 and again.stdout == ""
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and "corrupt" in lines[0] and target.name in lines[0]
    assert "--repair" in lines[0]
    with pytest.raises(ElmoUserError, match="corrupt"):
        pipeline.open_dataset(str(ds)).sql(query)


def test_a_checked_version_is_read_again_after_its_age(tmp_path: Path) -> None:
    from schemas.verify import VerifiedFiles

    known = VerifiedFiles(tmp_path / "cache.json", recheck_after_s=3600)
    known.remember(["a"])
    assert "a" in known and "a" in VerifiedFiles(tmp_path / "cache.json")
    data = json.loads((tmp_path / "cache.json").read_text())
    (tmp_path / "cache.json").write_text(json.dumps({k: t - 7200 for k, t in data.items()}))
    assert "a" not in VerifiedFiles(tmp_path / "cache.json", recheck_after_s=3600)


# --------------------------------------------------------------------------- inputs


@pytest.mark.slow
def test_a_missing_input_beside_good_ones_is_named(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("The cat sat on the mat .\n")
    missing, empty_glob = tmp_path / "nope.txt", str(tmp_path / "none" / "*.txt")
    with pytest.raises(ElmoUserError) as caught:
        _embed([str(good), str(missing), empty_glob], tmp_path / "out")
    assert str(missing) in str(caught.value) and empty_glob in str(caught.value)
    assert "--allow-missing" in str(caught.value)
    assert not (tmp_path / "out").exists()
    cli = _elmo("embed", str(good), str(missing), "--out", str(tmp_path / "out"),
                "--no-progress")
    assert cli.returncode == 2 and len(cli.stderr.strip().splitlines()) == 1
    assert str(missing) in cli.stderr
    summary = _embed([str(good), str(missing)], tmp_path / "out", allow_missing=True)
    assert summary.totals["documents"] == 1


# --------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Path:
    """A real 3 MB tmpfs (the dataset below needs about 10 MB): a disk that fills up."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.fail(f"a full-disk test needs to mount a tmpfs (root): {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_full_disk_ends_embed_with_one_line_and_a_rerun_finishes(
        small_disk: Path, tmp_path: Path) -> None:
    from schemas.verify import require_intact

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS.read_text() * 3)
    out = small_disk / "ds"
    full = _elmo("embed", str(corpus), "--out", str(out), "--shards", "12", "--no-progress",
                 "--executor", "local")
    lines = full.stderr.strip().splitlines()
    assert full.returncode == 1, full.stderr
    assert len(lines) == 1 and "the disk is full" in lines[0] and "rerun" in lines[0]
    assert "Traceback" not in full.stderr
    stored = int(lines[0].split(" work item(s)")[0].rsplit(" ", 1)[1])
    assert stored >= 1
    require_intact(str(out), remember=False)  # what was stored is whole
    # Room again: the same command finishes, to what one uninterrupted run writes.
    bigger = tmp_path / "ds"
    shutil.copytree(out, bigger)
    rerun = _elmo("embed", str(corpus), "--out", str(bigger), "--shards", "12",
                  "--no-progress", "--executor", "local")
    assert rerun.returncode == 0, rerun.stderr
    clean = _elmo("embed", str(corpus), "--out", str(tmp_path / "clean"), "--shards", "12",
                  "--no-progress", "--executor", "local")
    assert clean.returncode == 0
    from helpers import assert_same_dataset

    assert_same_dataset(bigger, tmp_path / "clean")


@pytest.mark.slow
def test_a_full_disk_stops_a_derived_writer_with_one_line_and_its_rerun_finishes(
        built: tuple[Path, str], tmp_path: Path) -> None:
    """`elmo senses label` on a dataset whose disk has no room left: one line, exit 1, the
    registry and every table as before, no file left half written; with room again the
    same command labels the word."""
    from pipeline.lookup.index.build import build_index

    size_mb = sum(p.stat().st_size for p in built[0].rglob("*") if p.is_file()) // 2**20 + 2
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs",
                           str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.fail(f"a full-disk test needs to mount a tmpfs (root): {made.stderr.strip()}")
    try:
        ds, index = mount / "ds", str(tmp_path / "ix")
        shutil.copytree(built[0], ds)
        build_index(str(ds), "top", index, kind="flat", compact=False)
        filler = mount / "filler"
        with open(filler, "wb") as handle, pytest.raises(OSError):
            while True:  # the disk's last bytes
                handle.write(b"\0" * 65536)
                handle.flush()
        before = sorted(str(p.relative_to(ds)) for p in ds.rglob("*"))
        full = _elmo("senses", "label", "the", "--index", index, "--k", "2")
        lines = full.stderr.strip().splitlines()
        assert full.returncode == 1 and len(lines) == 1, full.stderr
        assert "the disk is full" in lines[0] and "run the same command again" in lines[0]
        assert sorted(str(p.relative_to(ds)) for p in ds.rglob("*")) == before
        tokens = _elmo("sql", str(ds), "SELECT count(*) AS n FROM tokens", "--format", "json")
        assert tokens.returncode == 0, tokens.stderr
        filler.unlink()
        again = _elmo("senses", "label", "the", "--index", index, "--k", "2")
        assert again.returncode == 0, again.stderr
        count = _elmo("sql", str(ds), "SELECT count(*) AS n FROM senses WHERE word = 'the'",
                      "--format", "json")
        assert count.returncode == 0 and json.loads(count.stdout)["n"] > 0, count.stderr
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
