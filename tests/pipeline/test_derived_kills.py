"""The derived tables' writers killed at every phase (issue 50): ``elmo senses label`` and
``elmo pool`` killed with SIGKILL at each phase boundary of an update (``replace_rows``:
lock taken, file written, registry swapped, old file deleted) and between updates. After
each kill the dataset still answers (tokens and the derived table), ``elmo dataset
verify`` is clean or names what is left, and the same command run again ends with the
registry an uninterrupted run gives: the same rows and bytes for every key, no file left
that the registry does not list, no lock."""

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

import pytest
from helpers import REPO
from kill_hook import ON_PATH
from test_faults import _copy, _elmo, built  # noqa: F401 (built: the fixture)

# Runs one `elmo` command in a process that kills itself (SIGKILL: nothing is cleaned up)
# right after the n-th call of a step returns ("after") or as it is called ("before"), as
# the embed and index kill tests do. ``match``: only calls whose arguments name it count.
KILLER = ON_PATH + textwrap.dedent("""
    import json, os, sys
    from kill_hook import kill_at
    from pipeline import cli
    from pipeline.lookup.pooled import store
    from pipeline.lookup.senses import labels
    from schemas import derived_tables, files, lock

    where, name, when, nth, match, argv = sys.argv[1:7]
    owner = {"labels": labels, "store": store, "files": files, "os": os,
             "derived": derived_tables, "lock": lock.DatasetLock}[where]
    kill_at(owner, name, when, int(nth), match)
    cli.main(json.loads(argv))
    sys.exit(3)  # the hook never fired
""")

# Phase boundaries of one derived update and around it: (owner, step, when, n, match).
UPDATE_PHASES = {
    "lock taken": ("lock", "__enter__", "after", 1, ""),
    "file's temporary copy written": ("os", "replace", "before", 1, "/derived/"),
    "file written": ("files", "write_bytes_atomic", "after", 1, ""),
    "registry's temporary copy written": ("os", "replace", "before", 1, "_derived.json"),
    "registry swapped": ("files", "write_bytes_atomic", "after", 2, ""),
    "old file deleted": ("derived", "unlisted_files", "before", 1, ""),
}
LABEL_PHASES = {
    "clustered": ("labels", "replace_rows", "before", 1, ""),
    **UPDATE_PHASES,
    "one word done": ("labels", "replace_rows", "after", 1, ""),
}
POOL_PHASES = {
    "shard pooled": ("store", "pool_file", "after", 1, ""),
    "file written": UPDATE_PHASES["file written"],
    "registry swapped": UPDATE_PHASES["registry swapped"],
    "one shard done": ("store", "replace_rows", "after", 1, ""),
}
WORDS = ["and", "the"]  # "and" labelled before the killed run: its update replaces a file


def killed(phase: tuple[str, str, str, int, str], argv: list[str]) -> None:
    where, name, when, nth, match = phase
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", KILLER, where, name, when, str(nth), match,
                          json.dumps(argv)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == -signal.SIGKILL, f"exit {run.returncode}: {run.stderr[-2000:]}"


def registry_tables(ds: Path) -> dict[str, Any]:
    """Every derived key's rows, bytes and sha256 (file names hold a random part)."""
    tables = json.loads((ds / "_derived.json").read_text())["tables"]
    return {table: {key: {f: entry[f] for f in ("rows", "bytes", "sha256")}
                    for key, entry in entries.items()} for table, entries in tables.items()}


def still_answers(ds: Path, table: str) -> None:
    """`elmo sql` on tokens and on the derived table answers, and `elmo dataset verify`
    is clean or names the file a killed writer left (its next update deletes it)."""
    tokens = _elmo("sql", str(ds), "SELECT count(*) AS n FROM tokens", "--format", "json")
    assert tokens.returncode == 0 and json.loads(tokens.stdout)["n"] > 0, tokens.stderr
    if (ds / "_derived.json").exists():
        derived = _elmo("sql", str(ds), f"SELECT count(*) AS n FROM {table}", "--format",
                        "json")
        assert derived.returncode == 0, derived.stderr
    verify = _elmo("dataset", "verify", str(ds), "--no-progress")
    assert verify.returncode == 0 and "all match" in verify.stdout, verify.stdout
    if unlisted(ds):
        assert "note: 1 file(s) under derived/ that _derived.json does not list" in \
            verify.stdout, verify.stdout


def unlisted(ds: Path) -> set[str]:
    """Files under derived/ that the registry does not list."""
    registry = json.loads((ds / "_derived.json").read_text()) if \
        (ds / "_derived.json").exists() else {"tables": {}}
    listed = {e["path"] for entries in registry["tables"].values() for e in entries.values()}
    on_disk = {str(p.relative_to(ds)) for p in (ds / "derived").rglob("*") if p.is_file()} \
        if (ds / "derived").exists() else set()
    return on_disk - listed


def left_clean(ds: Path) -> None:
    assert unlisted(ds) == set()
    assert not list(ds.glob("_derived.json.*")) and not (ds / "_derived.lock").exists()


@pytest.fixture(scope="module")
def labelled(built: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory  # noqa: F811
             ) -> tuple[Path, str, dict[str, Any]]:
    """A copy of the dataset with "and" labelled, and what labelling WORDS then gives."""
    from pipeline.lookup.senses.labels import label_words

    ds, index = _copy(built, tmp_path_factory.mktemp("label_kills"))
    label_words(index, WORDS[:1], k=2)
    reference, reference_index = _copy((ds, index), tmp_path_factory.mktemp("reference"))
    assert _elmo(*label_argv(reference_index)).returncode == 0
    return ds, index, registry_tables(reference)


def label_argv(index: str) -> list[str]:
    return ["senses", "label", *WORDS, "--index", index, "--k", "2"]


@pytest.mark.slow
@pytest.mark.parametrize("phase", list(LABEL_PHASES), ids=lambda p: p.replace(" ", "_"))
def test_senses_label_killed_at_a_phase(labelled: tuple[Path, str, dict[str, Any]],
                                        tmp_path: Path, phase: str) -> None:
    source, index, reference = labelled
    ds, index = _copy((source, index), tmp_path)
    before = registry_tables(ds)
    killed(LABEL_PHASES[phase], label_argv(index))
    after = registry_tables(ds)["senses"]
    # Each word's rows are its old ones or its new ones, never a mix or a missing file.
    for word, entry in after.items():
        assert entry in (before["senses"].get(word), reference["senses"][word]), word
    still_answers(ds, "senses")
    rerun = _elmo(*label_argv(index))
    assert rerun.returncode == 0, rerun.stderr
    assert registry_tables(ds) == reference
    left_clean(ds)


@pytest.fixture(scope="module")
def pooled(built: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory  # noqa: F811
           ) -> tuple[Path, dict[str, Any]]:
    """The dataset, and what pooling it by sentence gives."""
    reference = tmp_path_factory.mktemp("pool_kills") / "reference"
    shutil.copytree(built[0], reference)
    assert _elmo(*pool_argv(reference)).returncode == 0
    return built[0], registry_tables(reference)


def pool_argv(ds: Path) -> list[str]:
    return ["pool", str(ds), "--by", "sentence", "--no-progress"]


@pytest.mark.slow
@pytest.mark.parametrize("phase", list(POOL_PHASES), ids=lambda p: p.replace(" ", "_"))
def test_pool_killed_at_a_phase(pooled: tuple[Path, dict[str, Any]], tmp_path: Path,
                                phase: str) -> None:
    source, reference = pooled
    ds = tmp_path / "ds"
    shutil.copytree(source, ds)
    killed(POOL_PHASES[phase], pool_argv(ds))
    if (ds / "_derived.json").exists():
        for key, entry in registry_tables(ds)["sentence_vectors"].items():
            assert entry == reference["sentence_vectors"][key], key
        still_answers(ds, "sentence_vectors")
    rerun = _elmo(*pool_argv(ds))  # without --rebuild: the shards not pooled yet
    assert rerun.returncode == 0, rerun.stderr
    assert registry_tables(ds) == reference
    left_clean(ds)
