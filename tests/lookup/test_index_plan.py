"""An index build's settings and plan (``pipeline/lookup/index/build_plan.py``): settings
checked once, in the API's terms; the plan (create or extend, which kind, the files added
and removed, why an index is built anew) a pure function of the settings, a real dataset
and the index as published, and what ``build_index`` then carries out."""

from __future__ import annotations

import json
from pathlib import Path

import lancedb
import pytest
from helpers import uncommit_shard_1
from synthetic_dataset import write_synthetic

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.build_plan import (
    BuildPlan,
    BuildSettings,
    PublishedIndex,
    plan_build,
)
from pipeline.lookup.index.meta import INDEX_META, SearchParams
from pipeline.lookup.index.words import WordSelection
from schemas.dataset import open_dataset

DIM, ROWS, SHARDS = 16, 600, 3


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plan")
    write_synthetic(root / "ds", ROWS, DIM, n_shards=SHARDS, vocab=50)
    return root / "ds"


def _plan(dataset: Path, out: Path, **given: object) -> BuildPlan:
    settings = BuildSettings(str(dataset), "top", str(out), **given)  # type: ignore[arg-type]
    db = lancedb.connect(str(out))
    return plan_build(settings, open_dataset(str(dataset)),
                      PublishedIndex.read(str(out), None, db))


@pytest.mark.parametrize(("given", "setting", "message"), [
    ({"kind": "ivf"}, "kind", "kind must be one of auto, hnsw, flat"),
    ({"vector_dtype": "int4"}, "vector_dtype", "vector_dtype must be one of float16, float32"),
    ({"search": SearchParams(nprobes=0)}, "nprobes", "nprobes must be at least 1"),
    ({"search": SearchParams(refine_factor=0)}, "refine_factor",
     "refine_factor must be at least 1"),
])
def test_settings_are_checked_once_in_the_apis_terms(given: dict, setting: str,
                                                     message: str) -> None:
    with pytest.raises(SettingError) as raised:
        BuildSettings("ds", "top", "ix", **given)
    assert raised.value.setting == setting and str(raised.value) == message
    flags = raised.value.named(lambda name: "--" + name.replace("_", "-"))
    assert flags.startswith(f"--{setting.replace('_', '-')} ")


def test_a_new_index_is_planned_whole_then_extended_by_what_changed(
        dataset: Path, tmp_path: Path) -> None:
    import shutil

    ds = Path(shutil.copytree(dataset, tmp_path / "ds"))
    out = tmp_path / "ix"
    new = _plan(ds, out)
    assert new.creates and new.compact and new.why_new is None
    assert len(new.add) == SHARDS and new.delete == () and new.kept == 0
    assert new.describe()[0].startswith(f"create a compact index at {out}")
    # Planning wrote nothing: the index is made by the build.
    assert not (out / INDEX_META).exists()
    record, kept = uncommit_shard_1(ds)
    build_index(str(ds), "top", str(out))
    same = _plan(ds, out)
    assert not same.creates and same.add == () and same.kept == SHARDS - 1
    record.write_bytes(kept)
    grown = _plan(ds, out)
    assert [key for key, _ in grown.add] == [k for k, _ in open_dataset(str(ds))
                                             .shard_files("tokens") if "shard=1" in k]
    assert grown.describe()[-1] == f"add 1 files, remove 0, keep {SHARDS - 1}"
    build_index(str(ds), "top", str(out))
    uncommit_shard_1(ds)
    shrunk = _plan(ds, out)
    assert shrunk.delete == tuple(key for key, _ in grown.add) and shrunk.add == ()
    assert _plan(ds, out, rebuild=True).creates


def test_the_plan_refuses_what_does_not_fit_the_index_and_renews_an_older_one(
        dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "ix"
    build_index(str(dataset), "top", str(out), words=WordSelection(["w1", "w2"]))
    with pytest.raises(SettingError, match="is a compact index; to build it not compact"):
        _plan(dataset, out, compact=False)
    with pytest.raises(SettingError, match="tune a full index"):
        _plan(dataset, out, kind="hnsw")
    with pytest.raises(SettingError, match="holds the words w1, w2; to index the words w3"):
        _plan(dataset, out, words=WordSelection(["w3"]))
    meta_path = out / INDEX_META
    meta = json.loads(meta_path.read_text())
    meta["stemmer"] = ""  # as an index built before word stems were stored
    meta_path.write_text(json.dumps(meta))
    renewed = _plan(dataset, out)
    assert renewed.creates and renewed.why_new == (
        f"{out} was built without snowball-english word stems: rebuilding it")


def test_a_build_refused_before_its_plan_leaves_no_folder(
        tmp_path: Path) -> None:
    with pytest.raises(ElmoUserError, match="is not an elmo-store dataset"):
        build_index(str(tmp_path / "none"), "top", str(tmp_path / "ix"))
    assert not (tmp_path / "ix").exists()
