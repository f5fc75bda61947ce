"""Which words changed: `elmo senses change` on a small real corpus embedded with the
bundled default model and indexed with LanceDB on disk.

Forty documents, twenty from the 1900s and twenty from the 2000s. "bank" means money in
the early ones and a river's edge in the late ones (a known change); "garden" is used the
same way throughout (a stable control). Each document also has a field with one value
(``corpus``) and a text field (``speaker``), for the mistakes a user makes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import REPO

from elmo_model.errors import ElmoUserError, SettingError, cli_flag
from pipeline.write.embed import EmbedConfig, ModelSpec, embed_corpus

MONEY = [
    "She paid her savings into the bank on Monday morning.",
    "He borrowed money from the bank to buy a house.",
    "The banks raised the interest rate on every loan.",
    "My salary goes straight into an account at the bank.",
    "The bank lent the merchant a large sum of gold.",
]
RIVER = [
    "They sat on the grassy bank of the river and fished.",
    "The boat drifted toward the muddy bank of the stream.",
    "Willows grew thick along the banks beside the water.",
    "The children climbed down the steep bank to the river.",
    "Reeds covered the bank where the river bends.",
]
GARDEN = [
    "We planted roses in the garden behind the house.",
    "The garden was full of tomatoes in August.",
    "She watered the garden every evening.",
    "A small garden grew beside the old barn.",
    "Bees buzzed over the garden all afternoon.",
    "The children played in the garden after school.",
    "An old stone wall kept deer out of the garden.",
]
SPEAKERS = ("Ada", "Ben", "Cy")


def _records() -> list[dict]:
    records = []
    for i in range(40):
        late = i >= 20
        year = (2001 if late else 1901) + i % 20
        bank = (RIVER if late else MONEY)[i % 5]
        records.append({"id": f"doc/{i:02d}", "text": f"{bank} {GARDEN[(i * 3) % 7]}",
                        "year": year, "corpus": "letters", "speaker": SPEAKERS[i % 3]})
    return records


RECORDS = _records()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("senses_change")
    corpus = folder / "letters.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = folder / "ds"
    embed_corpus(EmbedConfig(sources=[str(corpus)], out=str(out),
                             model=ModelSpec.resolve(str(REPO / "models" / "default")),
                             min_items=2, progress=False, executor="local"))
    return out


@pytest.fixture(scope="module")
def index(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    from pipeline.lookup.index.build import build_index

    out = str(tmp_path_factory.mktemp("senses_change_ix") / "ix")
    build_index(str(dataset), "top", out, kind="flat", compact=False)
    return out


def _change(index: str, **kw: object) -> object:
    from pipeline.lookup.senses.change import word_changes

    # Each sentence of the corpus is in four documents: five distinct contexts of "bank"
    # (any form) in each century.
    kw.setdefault("min_uses", 5)
    kw.setdefault("resamples", 100)
    return word_changes(index, "year", 100, **kw)  # type: ignore[arg-type]


def test_the_changed_word_ranks_above_the_stable_one_with_every_score(index: str) -> None:
    ranking = _change(index)
    assert ranking.groups == ["1900-1999", "2000-2020"]
    by_word = {r.word: r for r in ranking.rows}
    # Word forms as search has them: "banks" counts as "bank".
    assert "banks" not in by_word
    bank, garden = by_word["bank"], by_word["garden"]
    # Distinct contexts per century (each sentence is in four documents); documents: all.
    assert bank.uses == {"1900-1999": 5, "2000-2020": 5} and bank.documents == 40
    assert garden.uses == {"1900-1999": 7, "2000-2020": 7}
    assert ranking.repeats > 0
    # Five contexts a century are too few to be sure of a change (a shuffle that leaves
    # one use in a group scores high: test_senses_change_calibration.py has enough).
    assert bank.rank < garden.rank and not garden.significant
    assert garden.scores["prt"] == pytest.approx(0, abs=1e-6)  # the same sentences
    assert bank.change > garden.change and bank.scores["prt"] > 0.05
    for method in ("prt", "apd", "jsd"):
        assert bank.z[method] > garden.z[method]
        assert np.isfinite(bank.scores[method])
    lo, hi = bank.interval  # (with five uses a group the bootstrap is biased upward)
    assert 0 < lo < hi
    ranked = [r.rank for r in ranking.rows]
    assert ranked == list(range(1, len(ranked) + 1))
    changes = [r.change for r in ranking.rows]
    assert changes == sorted(changes, reverse=True)


def test_one_pass_scores_equal_the_word_by_word_reference(index: str) -> None:
    """The summed pass gives what the word's own vectors, read with a search, give."""
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.layers.tokens import matrix
    from pipeline.lookup.senses.change_scores import group_scores

    ix = SenseIndex(index)
    rows = ix.occurrences(["bank"], columns=["doc_id", "sent_idx", "tok_idx", "sentence"],
                          column="token_stem")
    # One use per distinct sentence and century (the first document's).
    kept = sorted({(int(d.split("/")[1]) >= 20, t): i for i, (d, t) in sorted(
        enumerate(zip(rows.column("doc_id").to_pylist(), rows.column("sentence").to_pylist(),
                      strict=True)), key=lambda item: item[1][0], reverse=True)}.values())
    rows = rows.take(kept)
    x = matrix(rows.column("vector")).astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    late = np.array([int(d.split("/")[1]) >= 20 for d in rows.column("doc_id").to_pylist()])
    assert len(rows) == 10
    sums = np.stack([x[~late].sum(0), x[late].sum(0)])
    counts = np.array([(~late).sum(), late.sum()], np.float64)
    expected = group_scores(sums @ sums.T, counts, np.ones((2, 1)))
    bank = next(r for r in _change(index, words=["bank", "garden"]).rows if r.word == "bank")
    assert bank.scores["prt"] == pytest.approx(float(expected["prt"]), abs=1e-6)
    assert bank.scores["apd"] == pytest.approx(float(expected["apd"]), abs=1e-6)
    # The same ranking from a compact index (vectors mixed from the dataset).
    assert 0.0 < bank.scores["prt"] < bank.scores["apd"]


@pytest.mark.slow
def test_a_compact_index_ranks_the_same(dataset: Path, index: str, tmp_path: Path) -> None:
    from pipeline.lookup.index.build import build_index

    compact = str(tmp_path / "compact")
    build_index(str(dataset), "top", compact, compact=True)
    full = {r.word: r for r in _change(index).rows}
    small = {r.word: r for r in _change(compact).rows}
    assert full.keys() == small.keys()
    for word, row in full.items():
        assert small[word].scores["prt"] == pytest.approx(row.scores["prt"], abs=2e-3)
        assert small[word].uses == row.uses


def test_cli_table_json_and_parquet(index: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import cli

    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.lookup.cli",))
    out = tmp_path / "change.parquet"
    assert cli.main(["senses", "change", "--index", index, "--by", "year", "--bin", "100",
                     "--min-uses", "5", "--top", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    assert "groups of year in bins of 100" in lines[0] and "ranked by prt" in lines[0]
    assert "distinct contexts" in lines[0] and "repeated uses left out" in lines[0]
    assert "less its mean" in lines[1] and "Benjamini-Hochberg" in lines[1]
    assert "significant (* sig: q <= 0.05)" in lines[2]
    assert lines[3].split()[:6] == ["rank", "word", "change", "p", "q", "sig"]
    assert "contexts" in lines[3].split()
    assert lines[4].split()[:2] == ["1", "bank"]
    assert len(lines) == 7
    assert f"wrote {out} (3 words)" in printed.err
    table = pq.read_table(out)
    assert table.column("word").to_pylist()[0] == "bank"
    assert {"change", "prt", "apd", "jsd", "interval_low", "interval_high",
            "uses_by_group"} <= set(table.column_names)
    assert table.column("uses_by_group").to_pylist()[0] == [
        {"group": "1900-1999", "uses": 5}, {"group": "2000-2020", "uses": 5}]
    assert 0 < table.column("q").to_pylist()[0] <= 1
    assert cli.main(["senses", "change", "--index", index, "--by", "year", "--bin", "100",
                     "--min-uses", "5", "--words", "garden,bank", "--method", "apd",
                     "--format", "json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["word"] for r in rows] == ["bank", "garden"]
    assert all(r["method"] == "apd" and r["change"] == r["apd_excess"] for r in rows)


@pytest.mark.parametrize(("argv", "message"), [
    (["--by", "decade"], "no document has a field 'decade'; pass --by one of doc_id, source, "
                         "line, corpus, speaker, year"),
    (["--by", "corpus"], "every document with corpus is in one group (letters), so there is "
                         "nothing to compare; pass --by a field with two values or more"),
    (["--by", "speaker", "--bin", "10"], "speaker holds text (e.g. 'Ada'), which has no bins; "
                                          "leave out --bin"),
    (["--by", "year", "--bin", "10000"], "every document with year is in one group "
                                         "(0-2020), so there is nothing to compare; pass "
                                         "--by a field with two values or more or a smaller "
                                         "--bin"),
    (["--by", "year", "--bin", "100", "--words", "bank", "--min-uses", "25"],
     "'bank' has too few uses to compare: it needs 25 in at least two groups and has "
     "1900-1999: 5, 2000-2020: 5; pass --min-uses 5 or less"),
    (["--by", "year", "--bin", "100", "--max-q", "0"],
     "--max-q is a false discovery rate between 0 and 1, not 0"),
    (["--by", "year", "--bin", "100", "--words", "zebra"], "'zebra' is not in this index|"
                                                           "no uses"),
])
def test_bad_input_is_one_line_naming_the_fix_and_writes_nothing(
        index: str, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str) -> None:

    from pipeline import cli

    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.lookup.cli",))
    out = tmp_path / "change.parquet"
    assert cli.main(["senses", "change", "--index", index, "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("elmo: error: "), err
    assert any(m in err[0] for m in message.split("|")), err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_word_s_senses_per_group(index: str, tmp_path: Path) -> None:
    from pipeline.lookup.senses.over_time import (
        sense_timeline,
        timeline_lines,
        write_timeline_html,
        write_timeline_png,
    )

    timeline = sense_timeline(index, "bank", "year", 100, k=2)
    rows = timeline.breakdown.rows
    assert [r.value for r in rows] == ["1900-1999", "2000-2020"]
    # The ranking's forms ("banks" too) and its counts: distinct contexts per century.
    ranked = next(r for r in _change(index, words=["bank"]).rows)
    assert [r.total for r in rows] == [ranked.uses[r.value] for r in rows] == [5, 5]
    assert all(len(r.counts) == 2 and sum(r.counts) == r.total for r in rows)
    lines = timeline_lines(timeline)
    assert lines[0].startswith("senses of 'bank' (with banks) by year (bins of 100)")
    assert "distinct contexts" in lines[0]
    assert "contexts" in next(line for line in lines if line.startswith("year")).split()
    assert any("e.g. doc/" in line for line in lines)
    data = timeline.to_dict()
    assert data["counted"] == "distinct contexts"
    assert [len(data["uses"][g]) for g in ("1900-1999", "2000-2020")] == [5, 5]
    # Each sentence's first document (doc/00..doc/04 hold the five money sentences).
    assert {u["doc_id"] for u in data["uses"]["1900-1999"]} == {
        r["id"] for r in RECORDS[:5] if re.search(r"\bbanks?\b", r["text"])}
    png, html = tmp_path / "bank.png", tmp_path / "bank.html"
    write_timeline_png(timeline, png)
    write_timeline_html(timeline, html)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = html.read_text()
    assert "share of the word" in text and "1900-1999" in text


def test_cli_word_senses_over_time(index: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import cli

    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.lookup.cli",))
    png = tmp_path / "bank.png"
    assert cli.main(["senses", "change", "bank", "--index", index, "--by", "year", "--bin",
                     "100", "--k", "2", "--plot", str(png)]) == 0
    printed = capsys.readouterr()
    assert "1900-1999" in printed.out and "sense 2" in printed.out
    assert f"wrote {png}" in printed.err and png.exists()
    with pytest.raises(ElmoUserError):
        from pipeline.lookup.senses.over_time import sense_timeline

        sense_timeline(index, "bank", "speaker", 5)


# --------------------------------------------------------------------------- senses as data


def test_labels_are_a_derived_table_sql_joins_and_any_reader_reads(
        dataset: Path, index: str) -> None:
    import duckdb

    from pipeline.lookup.senses.labels import label_words
    from pipeline.lookup.sql import run_query
    from schemas.dataset import open_dataset
    from schemas.derived_tables import DERIVED_FILE, read_registry
    from schemas.verify import verify_dataset

    done = label_words(index, ["bank", "Garden"], k=2)
    # A written word in any case (as senses cluster matches it): "banks" is not "bank".
    assert [(d.word, d.rows, d.k) for d in done] == [("bank", 32, 2), ("garden", 40, 2)]
    # Without our code: the registry is JSON, the files plain Parquet.
    registry = json.loads((dataset / DERIVED_FILE).read_text())
    entry = registry["tables"]["senses"]["bank"]
    table = pq.read_table(dataset / entry["path"])
    assert table.num_rows == entry["rows"] == 32
    assert table.column_names == ["word", "doc_id", "sent_idx", "tok_idx", "token", "sense",
                                  "label", "distance", "model", "mix"]
    rows = table.to_pylist()
    assert {r["mix"] for r in rows} == {"top"} and {r["sense"] for r in rows} == {1, 2}
    assert all(0 <= r["distance"] <= 2 and r["label"] for r in rows)
    files = [str(dataset / e["path"]) for e in registry["tables"]["senses"].values()]
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet({files!r})").fetchall()[0][0] == 72
    # elmo sql: the senses view joins tokens and the documents' typed fields.
    per_century = run_query(str(dataset), (
        "SELECT d.year // 100 * 100 AS century, s.sense, count(*) AS uses FROM senses s "
        "JOIN documents d USING (doc_id) WHERE s.word = 'bank' GROUP BY ALL "
        "ORDER BY century, uses DESC")).to_pylist()
    assert sum(r["uses"] for r in per_century) == 32
    assert {r["century"] for r in per_century} == {1900, 2000}
    assert all(r["sense"] in (1, 2) for r in per_century)
    joined = run_query(str(dataset), (
        "SELECT count(*) AS n, count(*) FILTER (t.token = s.token) AS same FROM senses s "
        "JOIN tokens t USING (doc_id, sent_idx, tok_idx) WHERE s.word = 'garden'")).to_pylist()
    assert joined == [{"n": 40, "same": 40}]
    # Relabelling replaces the word's rows at once: the old file goes.
    label_words(index, ["bank"], k=3)
    after = read_registry(*_fs_root(dataset))["tables"]["senses"]
    assert after["bank"]["path"] != entry["path"] and not (dataset / entry["path"]).exists()
    senses = run_query(str(dataset), "SELECT word, max(sense) AS k, count(*) AS n FROM "
                                     "senses GROUP BY word ORDER BY word").to_pylist()
    assert senses == [{"word": "bank", "k": 3, "n": 32}, {"word": "garden", "k": 2, "n": 40}]
    # elmo dataset verify checks the derived files too.
    ds = open_dataset(str(dataset))
    report = verify_dataset(ds.fs, ds.root, ds.descriptor)
    assert not report.problems and {f.table for f in report.files} >= {"tokens", "senses"}
    damaged = dataset / after["garden"]["path"]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    report = verify_dataset(ds.fs, ds.root, ds.descriptor)
    assert [(p.table, p.status) for p in report.problems] == [("senses", "corrupt")]
    label_words(index, ["garden"], k=2)  # and labelling again mends it
    assert not verify_dataset(ds.fs, ds.root, ds.descriptor).problems


def _fs_root(dataset: Path) -> tuple[object, str]:
    from schemas.dataset import open_fs

    return open_fs(str(dataset))


def test_documents_view_has_typed_field_columns(dataset: Path) -> None:
    from pipeline.lookup.sql import connect

    con = connect(str(dataset))
    types = dict(con.sql("SELECT column_name, column_type FROM (DESCRIBE documents)")
                 .fetchall())
    assert types["year"] == "BIGINT" and types["speaker"] == "VARCHAR"
    assert types["corpus"] == "VARCHAR" and "metadata" in types
    rows = con.sql("SELECT doc_id, year, speaker FROM documents WHERE year >= 2019 "
                   "ORDER BY doc_id").fetchall()
    assert rows == [(r["id"], r["year"], r["speaker"]) for r in RECORDS if r["year"] >= 2019]


@pytest.mark.slow
def test_served_routes_take_ids_with_slashes_and_follow_filters(
        dataset: Path, index: str, tmp_path: Path) -> None:
    import httpx
    from serve_helpers import Served, running_server

    with running_server(Served(dataset, Path(index)), log=tmp_path / "server.log") as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        # A document id with a slash, sent as %2F (what the page's encodeURIComponent does).
        got = client.get("/sentences/doc%2F03/0", params={"context": 1})
        assert got.status_code == 200, got.text
        assert got.json()["doc_id"] == "doc/03" and got.json()["sentences"][0]["text"]
        assert client.get("/sentences/doc%2F99/0").status_code == 404
        # The sense map follows the filter box.
        late = client.get("/senses/bank", params={"where": "year>=2000"}).json()
        assert late["rows"] == 16 and all(int(p["doc_id"][4:]) >= 20 for p in late["points"])
        # A word's senses per group.
        change = client.get("/senses/bank/change", params={"by": "year", "bin": 100,
                                                          "k": 2}).json()
        assert [r["value"] for r in change["rows"]] == ["1900-1999", "2000-2020"]
        assert len(change["uses"]["2000-2020"]) == 5 and len(change["senses"]) == 2
        bad = client.get("/senses/bank/change", params={"by": "speaker", "bin": 5})
        assert bad.status_code == 400 and "holds text" in bad.json()["error"]
        typed = client.post("/sql", json={"query": "SELECT year FROM documents WHERE doc_id = "
                                                   "'doc/03'"}).json()
        assert typed["rows"] == [[1904]]


def test_hits_show_one_line_around_the_word() -> None:
    from pipeline.lookup.senses.hits import Hit

    page = ("<html>\n<body>\n" + "filler words here " * 40 + "\n<p>the river bank\nwas "
            "steep</p>\n" + "more filler text " * 40 + "</body></html>")
    start = page.index("bank")
    hit = Hit(1, 1.0, "bank", "spam-2/00099", 0, 7, page, start, start + 4)
    shown = hit.snippet(80)
    assert "\n" not in shown and "[bank]" in shown and len(shown) <= 90
    assert shown.startswith("…") and shown.endswith("…")
    # Offsets that no longer point at the word (a text normalised since): found near them.
    moved = Hit(1, 1.0, "bank", "d", 0, 7, page.replace("\n", ""), start, start + 4)
    assert "[bank]" in moved.snippet(80)


def test_cluster_counts_line_says_what_each_number_counts(
        index: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import cli

    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.lookup.cli",))
    assert cli.main(["senses", "cluster", "bank", "--index", index, "--k", "2", "--by",
                     "year", "--bin", "100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # 32 uses of "bank", 8 distinct sentences (each template in 4 documents).
    assert lines[0].startswith("bank: 32 uses in 8 distinct contexts (24 repeat a sentence "
                               "already seen: counted once, in the tables per group, and "
                               "drawn once)")
    table = lines[lines.index("occurrences by year (bins of 100):") + 2:]
    # Per century, each distinct sentence once: the four of "bank" in each.
    assert sum(int(line.split()[1]) for line in table) == 8


def test_resampled_scores_through_the_gram_matrix_equal_summing_the_vectors() -> None:
    from pipeline.lookup.senses.change_scores import (
        Blocks,
        bootstrap_picks,
        group_scores,
        resampled_scores,
        shuffled_picks,
    )

    rng = np.random.default_rng(3)
    sizes = [5, 3, 4]
    blocks = Blocks(np.r_[0, np.cumsum(sizes)[:-1]], rng.normal(size=(12, 16)),
                    rng.integers(0, 6, 12).astype(float), rng.integers(0, 4, (12, 3)) * 1.0)
    for picks in (shuffled_picks(blocks, 7, rng), bootstrap_picks(blocks, 7, rng)):
        fast = resampled_scores(blocks, picks)
        for r in range(len(picks)):
            parts = np.split(picks[r], np.cumsum(sizes)[:-1])
            sums = np.stack([blocks.sums[p].sum(0) for p in parts])
            want = group_scores(sums @ sums.T, np.array([blocks.counts[p].sum() for p in parts]),
                                np.stack([blocks.senses[p].sum(0) for p in parts]))
            for method, value in want.items():
                np.testing.assert_allclose(fast[method][r], value, rtol=1e-9, equal_nan=True)


def test_excess_ranks_by_how_much_z_by_how_sure(index: str) -> None:
    by_excess = _change(index, score="excess", words=["bank", "garden"])
    assert by_excess.score == "excess" and by_excess.rows[0].word == "bank"
    for row in by_excess.rows:
        assert row.change == pytest.approx(row.scores["prt"] - row.null_mean)
        assert row.to_dict()["prt_excess"] == pytest.approx(row.change, abs=1e-6)
    by_z = _change(index, score="z", words=["bank", "garden"])
    assert all(row.change == row.z["prt"] for row in by_z.rows)
    with pytest.raises(SettingError, match=r"^score must be one of excess, z") as caught:
        _change(index, score="size")
    assert caught.value.named(cli_flag).startswith("--score must be one of")  # the CLI's
