"""The sense index's layout 2 on a real embedded dataset: float16 vectors, each sentence's
text once (fetched by key for the hits), a word selection kept by later builds and job
refreshes, progress on stderr, and an index of the layout before refused, then rebuilt."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers import write_corpus

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.build import build_index
from pipeline.lookup.index.sense_index import INDEX_META, TABLE, SenseIndex
from pipeline.lookup.index.sentences import SENTENCES_TABLE, with_sentences
from pipeline.lookup.index.words import SELECTED_WORDS, WordSelection
from pipeline.lookup.senses.clusters import cluster_senses
from pipeline.lookup.senses.search import nearest_distinct
from pipeline.lookup.sql import connect
from pipeline.write.embed import EmbedConfig, ModelSpec, embed_corpus

LINES = [
    "She deposited her salary at the bank on Monday morning.",
    "The bank approved the loan and opened a savings account.",
    "They sat on the grassy bank of the river and watched the water.",
    "Flood water rose over the river bank and covered the fields.",
    "We walked along the steep bank beside the flowing river.",
    "The river was calm, and the bank was quiet.",
]


def run_cli(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> int:
    from pipeline import cli

    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.lookup.cli",))
    return cli.main(argv)


def _embed(model_dir: Path, corpus: Path, out: Path, part: str = "main") -> None:
    embed_corpus(EmbedConfig(sources=[str(corpus)], out=str(out),
                             model=ModelSpec.resolve(str(model_dir)), min_items=2,
                             progress=False, executor="local", part=part))


@pytest.fixture(scope="module")
def dataset(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layout")
    (root / "bank.txt").write_text("\n".join(LINES) + "\n")
    _embed(tiny_model_dir, root / "bank.txt", root / "ds")
    return root / "ds"


def _copy(dataset: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(dataset, tmp_path / "ds"))


def _dataset_sentences(dataset: Path) -> dict[tuple[str, int], str]:
    con = connect(str(dataset))
    return {(d, s): t for d, s, t in con.sql("SELECT doc_id, sent_idx, text FROM sentences"
                                             ).fetchall()}


@pytest.mark.slow
def test_sentences_are_stored_once_and_hits_show_them(dataset: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "ix")
    build_index(str(dataset), "top", out, kind="flat", compact=False)
    ix = SenseIndex(out)
    assert ix.meta.layout == 2 and ix.meta.vector_dtype == "float16"
    assert "sentence" not in ix.table.schema.names
    assert ix.table.schema.field("vector").type.value_type == pa.float16()
    texts = _dataset_sentences(dataset)
    stored = ix.sentences.to_arrow()
    assert stored.num_rows == len(texts)  # one row per sentence, not per token
    assert {(d, s): t for d, s, t in zip(stored["doc_id"].to_pylist(),
                                         stored["sent_idx"].to_pylist(),
                                         stored["text"].to_pylist(), strict=True)} == texts
    rows = ix.table.search().select(["vector", "doc_id", "sent_idx", "token"]).to_arrow()
    query = np.array(rows["vector"][0].as_py(), np.float32)
    hits = nearest_distinct(ix, query, k=3, words=["bank"])
    assert hits and all(h.token.lower() == "bank" for h in hits)
    for hit in hits:  # the text by key, and the word where start/end say
        assert hit.sentence == texts[(hit.doc_id, hit.sent_idx)]
        assert hit.sentence[hit.start:hit.end] == hit.token
        assert f"[{hit.token}]" in hit.highlighted()
    # Texts held in memory (as a server holds them) give the same hits.
    assert ix.hold_sentences() and not SenseIndex(out).hold_sentences(max_rows=1)
    assert nearest_distinct(ix, query, k=3, words=["bank"]) == hits
    result = cluster_senses(ix, ["bank"], k=2)
    assert all(h.sentence == texts[(h.doc_id, h.sent_idx)] for h in result.occurrences)
    # A fetch of many keys (past the pair filter) gives each row its own text, in order.
    many = ix.table.search().select(["doc_id", "sent_idx"]).limit(10_000).to_arrow()
    many = pa.concat_tables([many] * 60)
    filled = with_sentences(ix.sentences, many)
    assert filled["sentence"].to_pylist() == [texts[(d, s)] for d, s in zip(
        many["doc_id"].to_pylist(), many["sent_idx"].to_pylist(), strict=True)]


def _as_layout_1(index: str, old: str) -> None:
    """The index at ``index`` rewritten the way builds before layout 2 wrote it: float32
    vectors, the sentence text in every token row, no sentences table or layout fields."""
    import lancedb

    ix = SenseIndex(index)
    rows = with_sentences(ix.sentences, ix.table.to_arrow())
    vectors = np.array(rows["vector"].to_pylist(), np.float32)
    rows = rows.set_column(rows.schema.get_field_index("vector"), "vector",
                           pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)),
                                                             vectors.shape[1]))
    lancedb.connect(old).create_table(TABLE, data=rows)
    meta = json.loads((Path(index) / INDEX_META).read_text())
    for name in ("layout", "vector_dtype", "words"):
        meta.pop(name)
    for name in ("versions", "word_counts_file", "selected_file"):  # recorded since
        meta.pop(name, None)
    (Path(old) / INDEX_META).write_text(json.dumps(meta))


def test_an_index_of_the_layout_before_is_refused_and_rebuilt_by_a_build(
        dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import cli

    new, old = str(tmp_path / "new"), str(tmp_path / "old")
    build_index(str(dataset), "top", new, kind="flat", compact=False)
    _as_layout_1(new, old)
    # Refused when opened, in one line naming the build; described still (index info).
    with pytest.raises(ElmoUserError) as raised:
        SenseIndex(old)
    message = str(raised.value)
    assert "\n" not in message and "sentence text in every row" in message
    assert f"`elmo index build {dataset.resolve()} --mix top --out {old}`" in message
    assert SenseIndex(old, any_layout=True).meta.layout == 1
    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.lookup.cli",))
    assert cli.main(["index", "info", old]) == 0
    said: list[str] = []
    build_index(str(dataset), "top", old, kind="flat", compact=False, progress=said.append)
    assert any("sentence text in every row: rebuilding" in line for line in said)
    assert SenseIndex(old).meta.layout == 2
    ix_old, ix_new = SenseIndex(old), SenseIndex(new)
    query = np.array(ix_new.table.search().limit(1).to_arrow()["vector"][0].as_py(), np.float32)
    got_old = nearest_distinct(ix_old, query, k=4, words=["bank"])
    got_new = nearest_distinct(ix_new, query, k=4, words=["bank"])
    # The rebuilt index answers as one built new.
    assert [(h.doc_id, h.sent_idx, h.tok_idx, h.sentence, h.start, h.end) for h in got_old] \
        == [(h.doc_id, h.sent_idx, h.tok_idx, h.sentence, h.start, h.end) for h in got_new]
    assert np.allclose([h.similarity for h in got_old], [h.similarity for h in got_new],
                       atol=2e-3)


def test_word_selection_is_recorded_refused_kept_and_rebuilt(
        dataset: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    from jobs.index_refresh import refresh_index
    from schemas.dataset import open_dataset

    ds = _copy(dataset, tmp_path)
    out = str(tmp_path / "ix")
    build_index(str(ds), "top", out, kind="flat", compact=False,
                words=WordSelection(["Bank", "river"]))
    ix = SenseIndex(out)
    assert ix.meta.words == {"words": ["bank", "river"], "min_count": None, "max_count": None}
    assert set(ix.table.to_arrow()["token_lower"].to_pylist()) == {"bank", "river"}
    # Only the sentences the kept tokens are in.
    assert ix.sentences.count_rows() == len(LINES)
    query = np.zeros(ix.meta.dim, np.float32)
    query[0] = 1.0
    with pytest.raises(ElmoUserError, match="water is not in this index: it holds the words "
                                            "bank, river; rebuild it"):
        ix.search(query, k=2, words=["water"])
    with pytest.raises(ElmoUserError, match="not in this index"):
        cluster_senses(ix, ["water"])
    # Asking an index for another selection without rebuilding is refused, in the
    # library's terms (the CLI says --rebuild).
    with pytest.raises(ElmoUserError, match=r"add rebuild=True \(or use another out\)"):
        build_index(str(ds), "top", out, words=WordSelection(["water"]))
    # A job refresh adds the new part's rows of the same words only.
    more = tmp_path / "more"
    more.mkdir()
    (more / "more.txt").write_text("The river bank flooded and the water rose.\n")
    _embed(tiny_model_dir, more / "more.txt", ds, part="more")
    added = [f.path for f in open_dataset(str(ds)).shard_files("tokens") if "more" in f.key]
    summary = refresh_index(str(ds), mix="top", index_uri=out, add_files=added)
    assert summary.added_rows == 2  # "river", "bank" of 9 tokens
    assert set(SenseIndex(out).table.to_arrow()["token_lower"].to_pylist()) == {"bank",
                                                                               "river"}
    # A count range is resolved against the dataset's counts now, then kept as a list.
    counts = WordSelection(min_count=3, max_count=8)
    build_index(str(ds), "top", out, kind="flat", compact=False, words=counts, rebuild=True)
    kept = set(SenseIndex(out).table.to_arrow()["token_lower"].to_pylist())
    con = connect(str(ds))
    want = {w for w, n in con.sql("SELECT lower(token), count(*) FROM tokens GROUP BY 1"
                                  ).fetchall() if 3 <= n <= 8}
    selected = SenseIndex(out).meta.selected_file  # this build's own file (publish.py)
    assert kept == want and selected.startswith(SELECTED_WORDS.removesuffix(".parquet"))
    assert (Path(out) / selected).is_file()
    with pytest.raises(ElmoUserError, match="no word of the dataset"):
        build_index(str(ds), "top", str(tmp_path / "none"), words=WordSelection(min_count=999))


@pytest.mark.slow
def test_cli_words_file_progress_and_no_progress(dataset: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    words = tmp_path / "words.txt"
    words.write_text("bank\nriver\n")
    ix = str(tmp_path / "ix")
    assert run_cli(monkeypatch, ["index", "build", str(dataset), "--out", ix, "--words",
                                 str(words), "--full", "--index", "hnsw"]) == 0
    err = capsys.readouterr().err
    assert "keeping the words bank, river" in err
    assert "index: IVF_HNSW_SQ over 10 rows" in err and "done in" in err  # 6 bank, 4 river
    assert run_cli(monkeypatch, ["index", "info", ix]) == 0
    assert "words the words bank, river" in capsys.readouterr().out
    assert run_cli(monkeypatch, ["senses", "search", LINES[2], "--word", "grassy",
                                 "--index", ix]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grassy is not in this index" in err[0]
    quiet = str(tmp_path / "quiet")
    assert run_cli(monkeypatch, ["index", "build", str(dataset), "--out", quiet,
                                 "--words", "bank,river", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "index:" not in err.replace(f"index {quiet}", "")


def test_write_corpus_helper_indexes_whole(tiny_model_dir: Path, tmp_path: Path) -> None:
    """An index of every word keeps every token of a multi-document corpus."""
    ds = tmp_path / "ds"
    embed_corpus(EmbedConfig(sources=[str(write_corpus(tmp_path / "c") / "*")],
                             out=str(ds), model=ModelSpec.resolve(str(tiny_model_dir)),
                             min_items=2, progress=False, executor="local"))
    summary = build_index(str(ds), "top", str(tmp_path / "ix"), kind="flat", compact=False)
    n_tokens = connect(str(ds)).sql("SELECT count(*) FROM tokens").fetchall()[0][0]
    assert summary.rows == n_tokens
    assert (tmp_path / "ix" / f"{SENTENCES_TABLE}.lance").is_dir()


@pytest.mark.slow
def test_served_index_of_some_words(tmp_path_factory: pytest.TempPathFactory,
                                    tmp_path: Path) -> None:
    """Over HTTP, an index of some words answers for them (the sentence text fetched by
    key, the word where start/end say) and says in one 400 line that others are not in it."""
    import httpx
    from serve_helpers import Served, running_server, served_data

    data = served_data(tmp_path_factory)
    selected = tmp_path / "play.lance"
    build_index(str(data.dataset), "top", str(selected), words=WordSelection(["play", "plays"]))
    texts = _dataset_sentences(data.dataset)
    with running_server(Served(data.dataset, selected), log=tmp_path / "serve.log") as url:
        found = httpx.post(f"{url}/senses/search", json={
            "sentence": "Will you play upon this pipe ?", "word": "play", "k": 3}, timeout=60)
        assert found.status_code == 200, found.text
        hits = found.json()["hits"]
        assert len(hits) == 3
        for hit in hits:
            assert hit["sentence"] == texts[(hit["doc_id"], hit["sent_idx"])]
            assert hit["sentence"][hit["start"]:hit["end"]].lower().startswith("play")
        refused = httpx.post(f"{url}/senses/search", json={
            "sentence": "Will you play upon this pipe ?", "word": "pipe", "k": 3}, timeout=60)
        assert refused.status_code == 400
        assert "pipe is not in this index" in refused.json()["error"]
        page = httpx.get(f"{url}/occurrences/pipe", timeout=60)
        assert page.status_code == 400 and "not in this index" in page.json()["error"]
        uses = httpx.get(f"{url}/occurrences/play", timeout=60).json()["occurrences"]
        assert uses and all(u["sentence"] == texts[(u["doc_id"], u["sent_idx"])]
                            for u in uses)
