"""Index builds atomic as a whole (``pipeline/lookup/index/publish.py``): a build of any
kind (new, incremental, ``--rebuild``, a job's refresh) killed with SIGKILL at each phase
boundary leaves the previous index answering exactly as before, and the next build (with
or without ``--rebuild``) discards the half-done one and ends with every row and word
count right; an index that cannot be read back says so in one line naming the fix."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import REPO, uncommit_shard_1
from kill_hook import ON_PATH
from synthetic_dataset import write_synthetic

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.meta import INDEX_META
from pipeline.lookup.index.sense_index import SenseIndex
from pipeline.lookup.index.words import dataset_word_counts
from schemas.dataset import open_dataset

DIM, ROWS = 32, 4_000
KEYS = ["doc_id", "sent_idx", "tok_idx"]

# Runs one build in a process of its own that kills itself (SIGKILL: no cleanup of any
# kind runs) at a phase boundary: right after the n-th call of one of the build's steps
# returns ("after"), or as it is called ("before"), as the embed and job tests do.
KILLER = ON_PATH + textwrap.dedent("""
    import json, sys
    from kill_hook import kill_at
    from pipeline.lookup.index import build, publish, rows
    from jobs import index_refresh

    where, name, when, nth, call = sys.argv[1:6]
    module = {"build": build, "publish": publish, "rows": rows.IndexTables}[where]
    kill_at(module, name, when, int(nth))
    call = json.loads(call)
    if call.pop("refresh", False):
        index_refresh.refresh_index(**call)
    else:
        build.build_index(**call)
    sys.exit(3)  # the hook never fired
""")

# Phase boundaries: (module, function, before/after, n-th call). "rows" adds a file's
# rows chunk by chunk (_add), then its sentences; build_index then finishes the index.
PHASES = {
    "first rows": ("rows", "_add", "after", 1),
    "one file": ("rows", "add_file", "after", 1),
    "all rows": ("build", "finish_index", "before", 1),
    "optimize": ("build", "_optimize", "after", 1),
    "vector index": ("build", "_create_vector_index", "after", 1),
    "word counts": ("build", "_write_word_counts", "after", 1),
    "ivf": ("build", "build_shards", "after", 1),
    "full ivf": ("build", "build_ivf", "after", 1),
    "commit": ("publish", "clean_up", "before", 1),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("kills")
    truth = write_synthetic(root / "ds", ROWS, DIM, n_shards=4, vocab=200)
    return root / "ds", truth


def index_info(monkeypatch: pytest.MonkeyPatch, uri: Path) -> int:
    """`elmo index info URI`'s exit status."""
    from pipeline import cli

    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.lookup.cli",))
    return cli.main(["index", "info", str(uri)])


def answers(uri: Path, truth: dict) -> dict[str, Any]:
    """What an index answers: nearest rows (any word, a word, a filter; through its IVF and
    exact), every use of a word, the word counts and the rows."""
    ix = SenseIndex(str(uri))
    got: dict[str, Any] = {"rows": ix.meta.rows, "table rows": ix.table.count_rows(),
                           "w1 rows": ix.word_rows(["w1"])}
    uses = ix.occurrences(["w1"], columns=KEYS).select(KEYS).to_pylist()
    got["w1 uses"] = sorted(tuple(r[c] for c in KEYS) for r in uses)
    for i in (3, 1_500, 3_900):
        query = truth["top"][i]
        for label, kwargs in (("any", {}), ("exact", {"exact": True}),
                              ("word", {"words": ["w2"]}), ("where", {"where": "shard = 1"})):
            hits = ix.search(query, k=5, columns=KEYS, **kwargs)
            got[f"{label} {i}"] = [tuple(r[c] for c in KEYS) for r in hits.to_pylist()]
    return got


def complete(uri: Path, dataset: Path) -> None:
    """The index holds every committed row, and its word counts are the dataset's."""
    ix = SenseIndex(str(uri))
    assert ix.meta.rows == ix.table.count_rows() == ROWS
    counts = ix.word_counts.table()
    assert counts is not None
    mine = dict(zip(counts["token_lower"].to_pylist(), counts["rows"].to_pylist(),
                    strict=True))
    truth = dataset_word_counts(open_dataset(str(dataset)))
    want = dict(zip(truth["token_lower"].to_pylist(), truth["rows"].to_pylist(), strict=True))
    assert mine == want
    assert ix.word_rows(["w1"]) == want["w1"]


def killed_build(phase: str, call: dict[str, Any]) -> None:
    where, name, when, nth = PHASES[phase]
    env = dict(os.environ, PYTHONPATH=str(REPO), LANCEDB_LOG="error")
    run = subprocess.run([sys.executable, "-c", KILLER, where, name, when, str(nth),
                          json.dumps(call)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == -signal.SIGKILL, f"{phase}: exit {run.returncode}: {run.stderr}"


def prepared(data: tuple[Path, dict], tmp_path: Path, kind: str, compact: bool
             ) -> tuple[Path, Path, dict[str, Any], dict[str, Any]]:
    """A copy of the dataset and an index of it as ``kind`` finds it: none (new), of three
    of its four files (incremental, refresh) or of all (rebuild); returns the dataset, the
    index, its answers now and the killed build's call."""
    source, truth = data
    dataset, ix = tmp_path / "ds", tmp_path / "ix"
    shutil.copytree(source, dataset)
    options = {"compact": compact} | ({} if compact else {"kind": "hnsw"})
    call: dict[str, Any] = {"dataset": str(dataset), "mix": "top", "out": str(ix), **options}
    if kind == "new":
        return dataset, ix, {}, call
    record, kept = uncommit_shard_1(dataset)
    if kind == "rebuild":
        record.write_bytes(kept)
    build_index(str(dataset), "top", str(ix), **options)
    if kind in ("incremental", "refresh"):
        record.write_bytes(kept)
    before = answers(ix, truth)
    if kind == "rebuild":
        call["rebuild"] = True
    if kind == "refresh":
        added = [f.path for f in open_dataset(str(dataset)).shard_files("tokens")
                 if "shard=1" in f.key]
        call = {"refresh": True, "dataset": str(dataset), "mix": "top",
                "index_uri": str(ix), "add_files": added, "compact": compact}
    return dataset, ix, before, call


CASES = [  # (build kind, compact, phase): every phase of a rebuild, the others' own ones
    *[("rebuild", True, p) for p in ("first rows", "one file", "all rows", "optimize",
                                     "word counts", "ivf", "commit")],
    ("incremental", True, "all rows"), ("incremental", True, "ivf"),
    ("rebuild", False, "vector index"), ("rebuild", False, "full ivf"),
    ("incremental", False, "one file"), ("incremental", False, "full ivf"),
    ("refresh", True, "one file"), ("new", True, "ivf"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "compact", "phase"), CASES,
                         ids=[f"{k}-{'compact' if c else 'full'}-{p.replace(' ', '_')}"
                              for k, c, p in CASES])
def test_a_build_killed_at_a_phase_leaves_the_index_as_it_was_and_the_next_finishes(
        data: tuple[Path, dict], tmp_path: Path, kind: str, compact: bool,
        phase: str) -> None:
    dataset, ix, before, call = prepared(data, tmp_path, kind, compact)
    killed_build(phase, call)
    if kind == "new":
        # No index yet: opening the half-made one says so, naming the build.
        with pytest.raises(ElmoUserError, match="elmo index build"):
            answers(ix, data[1])
    elif phase == "commit":
        complete(ix, dataset)  # committed: the new index answers, whole
    else:
        assert answers(ix, data[1]) == before
    # The next build, without --rebuild, finds what the killed one left and finishes.
    options = {"compact": compact} | ({} if compact else {"kind": "hnsw"})
    build_index(str(dataset), "top", str(ix), **options)
    complete(ix, dataset)
    leftovers = [p.name for p in ix.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


@pytest.mark.slow
def test_a_killed_rebuild_then_a_rebuild(data: tuple[Path, dict], tmp_path: Path) -> None:
    """The issue's case: `--rebuild` killed while adding rows, then `--rebuild` again."""
    dataset, ix, before, call = prepared(data, tmp_path, "rebuild", True)
    killed_build("one file", call)
    assert answers(ix, data[1]) == before
    build_index(str(dataset), "top", str(ix), rebuild=True)
    complete(ix, dataset)
    assert answers(ix, data[1]) == before  # the same rows, the same answers


def test_an_index_that_lost_its_rows_says_so_and_the_next_build_makes_it_again(
        data: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """What a build before this commit could leave (its metadata listing every file, its
    table holding part of them): searches and `elmo index info` give one line naming the
    fix instead of a short answer; the next build, without --rebuild, builds it anew."""
    dataset, ix, _, _ = prepared(data, tmp_path, "rebuild", False)
    meta = json.loads((ix / INDEX_META).read_text())
    meta.pop("versions")  # as written before versions were recorded
    (ix / INDEX_META).write_text(json.dumps(meta))
    SenseIndex(str(ix)).table.delete("shard = 2")
    with pytest.raises(ElmoUserError, match=r"a build was stopped half way.*--rebuild"):
        answers(ix, data[1])
    assert index_info(monkeypatch, ix) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0] and "elmo index build" in err[0]
    said: list[str] = []
    build_index(str(dataset), "top", str(ix), compact=False, kind="hnsw",
                progress=said.append)
    assert any("building it anew" in line for line in said)
    complete(ix, dataset)


def test_a_version_that_is_gone_is_one_line_naming_the_fix(
        data: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """The JSON names a table version LanceDB no longer has (cleaned up by hand): one line,
    not LanceDB's "Version N no longer exists" traceback; the next build makes it again."""
    dataset, ix, _, _ = prepared(data, tmp_path, "rebuild", True)
    meta = json.loads((ix / INDEX_META).read_text())
    meta["versions"]["tokens"] = 1_000
    (ix / INDEX_META).write_text(json.dumps(meta))
    assert index_info(monkeypatch, ix) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert "cannot be read as built" in err[0] and "--rebuild" in err[0]
    build_index(str(dataset), "top", str(ix))
    complete(ix, dataset)


def test_an_unchanged_build_keeps_its_versions_and_answers(data: tuple[Path, dict],
                                                          tmp_path: Path) -> None:
    """A build with nothing to add publishes the same table versions: readers (and a
    server's held IVF) see no change, and nothing is rebuilt."""
    dataset, ix, before, _ = prepared(data, tmp_path, "rebuild", True)
    versions = SenseIndex(str(ix)).meta.versions
    summary = build_index(str(dataset), "top", str(ix))
    assert summary.added_rows == 0 and summary.ivf is None
    assert SenseIndex(str(ix)).meta.versions == versions
    assert answers(ix, data[1]) == before
    np.testing.assert_equal(before["rows"], ROWS)


def test_a_second_build_of_an_index_at_once_is_refused_in_one_line(
        data: tuple[Path, dict], tmp_path: Path) -> None:
    """Builds and refreshes hold the index's ``_lock`` (a killed one's is taken over, as
    the tests above show): another at the same time stops before it changes anything."""
    import socket
    import time

    from jobs.index_refresh import refresh_index

    ix = tmp_path / "ix"
    ix.mkdir()
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (ix / "_lock").write_text(json.dumps({"host": socket.gethostname(), "pid": owner.pid,
                                              "token": "x", "heartbeat": time.time()}))
        with pytest.raises(ElmoUserError, match="being written by another run"):
            build_index(str(data[0]), "top", str(ix))
        with pytest.raises(ElmoUserError, match="being written by another run"):
            refresh_index(str(data[0]), mix="top", index_uri=str(ix))
    finally:
        owner.kill()
        owner.wait()
    assert sorted(p.name for p in ix.iterdir()) == ["_lock"]
