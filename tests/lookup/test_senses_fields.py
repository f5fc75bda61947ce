"""Senses a historian can use: document fields on results, filters on them, senses counted
by a field, occurrence -> sense as Parquet, and clusters that follow meaning, not capitals.

A small JSON Lines corpus (fields year, president, and "speech-type", a name the index
cannot hold as a column) uses "bank" in two senses, money and river, each sentence once
as "Bank" (documents of the 1900s) and once as "bank" (the 2000s), so that the case of
the word and its sense are independent. It is embedded with the bundled default model
and indexed with LanceDB on disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import REPO

from elmo_model.errors import ElmoUserError, SettingError, cli_flag
from pipeline.lookup.doc_fields import FieldFilter, as_filters, parse_where
from pipeline.write.embed import EmbedConfig, ModelSpec, embed_corpus

MONEY = [
    "She paid her savings into the {} on Monday morning.",
    "He borrowed money from the {} to buy a house.",
    "The {} raised the interest rate on every loan.",
    "My salary goes straight into an account at the {}.",
    "The {} lent the merchant a large sum of gold.",
    "Robbers broke into the {} and stole the cash.",
]
RIVER = [
    "They sat on the grassy {} of the river and fished.",
    "The boat drifted toward the muddy {} of the stream.",
    "Willows grew thick along the {} beside the water.",
    "The children climbed down the steep {} to the river.",
    "Reeds covered the {} where the river bends.",
    "The flood washed away the {} of the creek.",
]
PRESIDENTS = {1901: "Theodore Roosevelt", 1905: "Theodore Roosevelt", 1913: "Woodrow Wilson",
              2001: "George W Bush", 2009: "Barack Obama", 2013: "Barack Obama"}


def _records() -> list[dict]:
    records = []
    for sense, lines in (("money", MONEY), ("river", RIVER)):
        for i, line in enumerate(lines):
            for word, years in (("Bank", (1901, 1905, 1913)), ("bank", (2001, 2009, 2013))):
                year = years[i % 3]
                records.append({"id": f"{sense}-{i}-{word}", "text": line.format(word),
                                "year": year, "president": PRESIDENTS[year],
                                "speech-type": "written" if i % 2 else "spoken",
                                "sense": sense})
    return records


RECORDS = _records()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("senses_fields")
    corpus = folder / "speeches.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = folder / "ds"
    embed_corpus(EmbedConfig(sources=[str(corpus)], out=str(out),
                             model=ModelSpec.resolve(str(REPO / "models" / "default")),
                             min_items=2, progress=False, executor="local"))
    return out


@pytest.fixture(scope="module")
def index(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    from pipeline.lookup.index.build import build_index

    out = str(tmp_path_factory.mktemp("senses_fields_ix") / "ix")
    build_index(str(dataset), "top", out, kind="flat", compact=False)
    return out


def _ids(**want: object) -> set[str]:
    return {r["id"] for r in RECORDS if all(r[k] == v for k, v in want.items())}


# --------------------------------------------------------------------------- fields, filters


def test_index_holds_plain_metadata_fields_as_columns(index: str) -> None:
    from pipeline.lookup.index.sense_index import SenseIndex

    ix = SenseIndex(index)
    # "speech-type" is no plain name: it stays out of the index, filtered on a join.
    assert ix.meta.doc_fields == {"president": "string", "sense": "string", "year": "int"}
    names = ix.table.schema.names
    assert {"source", "meta_year", "meta_president"} <= set(names)
    rows = ix.table.search().where("token_lower = 'bank'").select(
        ["doc_id", "meta_year", "meta_president"]).to_arrow().to_pylist()
    by_id = {r["id"]: r for r in RECORDS}
    assert len(rows) == len(RECORDS)
    for row in rows:
        assert row["meta_year"] == by_id[row["doc_id"]]["year"]
        assert row["meta_president"] == by_id[row["doc_id"]]["president"]


@pytest.mark.slow
def test_search_hits_carry_fields_and_filters_keep_only_passing_documents(
        index: str, dataset: Path) -> None:
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.senses.search import search_senses

    ix = SenseIndex(index)
    query = "He borrowed money from the bank to buy a house."
    hits = search_senses(ix, query, "bank", k=100)
    assert len(hits) == len(RECORDS)
    by_id = {r["id"]: r for r in RECORDS}
    for hit in hits:
        record = by_id[hit.doc_id]
        assert hit.fields["year"] == record["year"]
        assert hit.fields["president"] == record["president"]
        assert hit.fields["speech-type"] == record["speech-type"]
        assert hit.fields["source"].endswith("speeches.jsonl") and hit.fields["line"] >= 1
    cases = [({"president": "Barack Obama"}, _ids(president="Barack Obama")),
             ("year=1900..1909", _ids(year=1901) | _ids(year=1905)),
             ({"year": {">=": 1900, "<=": 1909}}, _ids(year=1901) | _ids(year=1905)),
             ({"year": [1901, 1905, 2009]}, _ids(year=1901) | _ids(year=1905) | _ids(year=2009)),
             (["year<=1910", "speech-type=written"],
              (_ids(year=1901) | _ids(year=1905)) & _ids(**{"speech-type": "written"})),
             ([FieldFilter("president", "~", "roosevelt")], _ids(president="Theodore Roosevelt")),
             ({"doc_id": ("money-0-bank", "river-0-Bank")}, {"money-0-bank", "river-0-Bank"}),
             ({"speech-type": "sung"}, set()),
             (parse_where("year~200"), _ids(year=2001) | _ids(year=2009))]
    for filters, expected in cases:
        found = search_senses(ix, query, "bank", k=100, filters=filters)
        assert {h.doc_id for h in found} == expected, filters
    # Indexed fields are LanceDB predicates on their columns; others a doc_id list.
    where = ix.fields_where(as_filters({"year": {">=": 1900, "<=": 1909}, "speech-type": "spoken"}))
    assert "meta_year >= 1900" in where and "meta_year <= 1909" in where
    assert "doc_id IN (" in where and "speech-type" not in where


def test_filter_mistakes_name_the_fix(index: str) -> None:
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.senses.clusters import cluster_senses

    ix = SenseIndex(index)
    with pytest.raises(ElmoUserError, match="no document has a field 'yaer'; the fields are "
                                            "doc_id, source, line, president, sense, "
                                            "speech-type, year"):
        ix.fields_where(as_filters({"yaer": 1900}))
    with pytest.raises(SettingError, match=r"year holds numbers: year>=the 1900s needs a "
                                           r"number \(e.g. where year>=1900\)") as caught:
        ix.fields_where(parse_where("year>=the 1900s"))
    assert "(e.g. --where year>=1900)" in caught.value.named(cli_flag)  # as the CLI says it
    with pytest.raises(ElmoUserError, match=r"bank: 0 distinct context.* in documents with "
                                            r"president=Nobody"):
        cluster_senses(ix, ["bank"], filters={"president": "Nobody"})


def test_where_syntax() -> None:
    assert parse_where("year>=1900") == [FieldFilter("year", ">=", "1900")]
    assert parse_where("year=1900..1950") == [FieldFilter("year", ">=", "1900"),
                                              FieldFilter("year", "<=", "1950")]
    assert parse_where("year=..1950") == [FieldFilter("year", "<=", "1950")]
    assert parse_where("president=Abraham Lincoln") == [
        FieldFilter("president", "=", "Abraham Lincoln")]
    assert parse_where("party=Whig|Democratic") == [
        FieldFilter("party", "in", ["Whig", "Democratic"])]
    assert parse_where("speech-type!=written") == [FieldFilter("speech-type", "!=", "written")]
    assert parse_where("president~lincoln") == [FieldFilter("president", "~", "lincoln")]
    for bad in ("year", "year>=", ">=1900", "year=.."):
        with pytest.raises(SettingError, match=r"^where ") as caught:
            parse_where(bad)
        assert caught.value.named(cli_flag).startswith("--where ")
    # A mapping says a range with operators; a list is "any of", however many values.
    assert as_filters({"year": {">=": 1900}, "party": ["Whig", "Democratic"]}) == [
        FieldFilter("year", ">=", 1900), FieldFilter("party", "in", ["Whig", "Democratic"])]
    assert as_filters({"year": [1900, 1950]}) == [FieldFilter("year", "in", [1900, 1950])]
    # Condition text reads as the CLI's --where, one string or several.
    assert as_filters("year=1900..1950") == parse_where("year=1900..1950")
    assert as_filters(["party=Whig|Democratic", FieldFilter("year", ">", 1900)]) == [
        FieldFilter("party", "in", ["Whig", "Democratic"]), FieldFilter("year", ">", 1900)]


# --------------------------------------------------------------------------- clusters


def _ari(a: list, b: list) -> float:
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(a, b))


def test_clusters_are_not_the_case_split(index: str) -> None:
    from pipeline.lookup.senses.clusters import cluster_senses

    results = {centre: cluster_senses(index, ["bank"], k=2, centre=centre)
               for centre in ("none", "case", "forms")}
    for centre, result in results.items():
        hits = result.occurrences
        assert len(hits) == len(RECORDS) and result.centre == centre
        case = [h.token for h in hits]
        labels = result.labels.tolist()
        if centre == "none":
            # As stored, capitals alone make the two clusters: Bank vs bank.
            assert _ari(case, labels) == pytest.approx(1.0)
            continue
        # Centred, case tells nothing: each sentence's "Bank" and "bank" share a cluster
        # (what separates the clusters is in the sentences, not in the capital).
        assert _ari(case, labels) < 0.1
        cluster_of = {h.doc_id: label for h, label in zip(hits, labels, strict=True)}
        for record in RECORDS:
            twin = record["id"][:-4] + ("bank" if record["id"].endswith("Bank") else "Bank")
            assert cluster_of[record["id"]] == cluster_of[twin]
    # Every member carries its document's fields.
    assert all(h.fields["year"] in PRESIDENTS for h in results["case"].occurrences)


def test_breakdown_counts_each_sense_per_bin_of_a_field(index: str) -> None:
    from pipeline.lookup.senses.clusters import cluster_senses
    from pipeline.lookup.senses.tables import breakdown_of, sense_breakdown

    table = sense_breakdown(index, "bank", by="year", bin=10, k=2)
    assert [r.value for r in table.rows] == ["1900-1909", "1910-1919", "2000-2009",
                                             "2010-2013"]
    expected = {"1900-1909": 8, "1910-1919": 4, "2000-2009": 8, "2010-2013": 4}
    assert {r.value: r.total for r in table.rows} == expected
    assert all(sum(r.counts) == r.total for r in table.rows)
    result = cluster_senses(index, ["bank"], k=2)
    assert [sum(r.counts[c] for r in table.rows) for c in range(2)] == \
        [c.size for c in result.clusters]
    assert table.to_dict()["rows"][0] == {"value": "1900-1909", "start": 1900,
                                          "counts": table.rows[0].counts, "total": 8}
    # Text fields: one row per value, sorted.
    by_sense = breakdown_of(result, "sense")
    assert [(r.value, r.total) for r in by_sense.rows] == [("money", 12), ("river", 12)]
    with pytest.raises(ElmoUserError, match="has a field 'decade'"):
        breakdown_of(result, "decade")
    with pytest.raises(ElmoUserError, match="president holds text, which has no bins"):
        breakdown_of(result, "president", bin=10)


@pytest.mark.slow
def test_cli_cluster_filters_breaks_down_and_exports(index: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import cli

    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.lookup.cli",))
    out = tmp_path / "bank.parquet"
    assert cli.main(["senses", "cluster", "bank", "--index", index, "--k", "2",
                     "--where", "year=1900..2010", "--by", "president", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "in documents with year>=1900 year<=2010" in printed.out
    assert "occurrences by president:" in printed.out
    assert "(president=Barack Obama" in printed.out or "president=Barack Obama" in printed.out
    assert f"wrote {out}" in printed.err
    table = pq.read_table(out)
    assert table.column_names[:10] == ["doc_id", "sent_idx", "tok_idx", "token", "cluster",
                                       "sense", "similarity", "sentence", "start", "end"]
    assert table.column_names[10:12] == ["source", "line"]
    # The corpus's own "sense" field is named apart from the cluster's sense name.
    assert {"year", "president", "speech-type", "doc_sense"} <= set(table.column_names[12:])
    rows = table.to_pylist()
    expected = {r["id"] for r in RECORDS if 1900 <= r["year"] <= 2010}
    assert {r["doc_id"] for r in rows} == expected and len(rows) == len(expected)
    assert {r["cluster"] for r in rows} == {1, 2}
    assert all(r["sense"].startswith(f"sense {r['cluster']} (") for r in rows)
    assert all(r["token"].lower() == "bank" and r["sentence"][r["start"]:r["end"]] == r["token"]
               for r in rows)
    # Search shows the fields asked for.
    assert cli.main(["senses", "search", "The bank lent him money.", "--word", "bank",
                     "--index", index, "-k", "2", "--fields", "year,president",
                     "--where", "president=Barack Obama"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all("(year=20" in line and "president=Barack Obama)" in line
                                   for line in lines)
    # A user error is one line naming the fix, before any work.
    assert cli.main(["senses", "cluster", "bank", "--index", index, "--bin", "10"]) == 2
    assert capsys.readouterr().err == ("elmo: error: --bin groups the values of --by FIELD; "
                                       "add --by (e.g. --by year)\n")


def test_assignments_cover_repeated_and_unsampled_occurrences(index: str) -> None:
    from pipeline.lookup.senses.clusters import cluster_senses
    from pipeline.lookup.senses.tables import assignments_table

    # 10 of 24 distinct contexts clustered: the other 14 go to their nearest centre.
    result = cluster_senses(index, ["bank"], k=2, max_contexts=10)
    table = assignments_table(result)
    assert len(result.occurrences) == 10 and table.num_rows == len(RECORDS)
    clustered = {(h.doc_id, int(label)) for h, label in zip(result.occurrences, result.labels,
                                                            strict=True)}
    rows = {(r["doc_id"], r["cluster"] - 1) for r in table.to_pylist()}
    assert clustered <= rows
    similarities = table.column("similarity").to_pylist()
    assert sum(s is not None for s in similarities) == 10
    assert np.isin(table.column("cluster").to_numpy(), [1, 2]).all()


def test_index_built_before_document_fields_is_refused_then_rebuilt(
        dataset: Path, index: str, tmp_path: Path) -> None:
    import shutil

    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.index.sense_index import INDEX_META, SenseIndex
    from pipeline.lookup.senses.search import search_senses

    old = tmp_path / "old"
    shutil.copytree(index, old)
    meta = json.loads((old / INDEX_META).read_text())
    del meta["doc_fields"]  # what an index written before document fields records
    (old / INDEX_META).write_text(json.dumps(meta))
    # An older storage generation: refused when opened, in one line naming the build.
    with pytest.raises(ElmoUserError) as raised:
        search_senses(str(old), "The bank lent him money.", "bank", k=100)
    message = str(raised.value)
    assert "\n" not in message and "without document fields" in message
    assert "elmo index build " in message and f"--out {old}`" in message
    lines: list[str] = []
    build_index(str(dataset), "top", str(old), kind="flat", compact=False, progress=lines.append)
    assert f"{old} was built without document fields: rebuilding it" in lines
    assert SenseIndex(str(old)).meta.doc_fields == {"president": "string", "sense": "string",
                                                   "year": "int"}
    hits = search_senses(str(old), "The bank lent him money.", "bank", k=100,
                         filters={"year": {">=": 2000, "<=": 2010}, "president": "Barack Obama"})
    assert {h.doc_id for h in hits} == _ids(year=2009)
    assert all(h.fields["president"] == "Barack Obama" for h in hits)


def test_case_centring_keeps_what_tells_lowercase_words_apart() -> None:
    from pipeline.lookup.senses.clusters import centred, form_offsets

    rng = np.random.default_rng(0)
    capital, plural = np.eye(8)[0] * 3, np.eye(8)[1] * 3
    tokens = ["Union"] * 6 + ["union"] * 6 + ["unions"] * 6 + ["UNION"] * 2
    shift = {"Union": capital, "union": 0, "unions": plural, "UNION": capital}
    x = np.stack([np.eye(8)[2] + shift[t] + rng.normal(0, 0.1, 8) for t in tokens])
    x /= np.linalg.norm(x, axis=1, keepdims=True)  # unit vectors, as cluster_senses has

    def means(v: np.ndarray) -> dict[str, np.ndarray]:
        return {t: v[[i for i, s in enumerate(tokens) if s == t]].mean(0) for t in set(tokens)}

    case_centred = centred(x, tokens, form_offsets(x, tokens, "case"))
    by_case = means(case_centred)
    # Union and union now share a mean; unions keeps its own; UNION (2 uses) is left as is.
    assert np.linalg.norm(by_case["Union"] - by_case["union"]) < 0.05
    assert np.linalg.norm(by_case["unions"] - by_case["union"]) > 0.5
    np.testing.assert_allclose(case_centred[-2:], x[-2:], atol=1e-6)
    by_form = means(centred(x, tokens, form_offsets(x, tokens, "forms")))
    assert np.linalg.norm(by_form["unions"] - by_form["union"]) < 0.05
    assert form_offsets(x, tokens, "none") == {}
    with pytest.raises(ElmoUserError, match="centre must be one of case, forms, none"):
        form_offsets(x, tokens, "lower")


def test_without_its_dataset_an_index_still_clusters_and_filters_its_own_fields(
        index: str, tmp_path: Path) -> None:
    import shutil

    from pipeline.lookup.index.sense_index import INDEX_META, SenseIndex
    from pipeline.lookup.senses.clusters import cluster_senses

    moved = tmp_path / "moved"
    shutil.copytree(index, moved)
    meta = json.loads((moved / INDEX_META).read_text())
    meta["dataset"] = str(tmp_path / "gone")
    (moved / INDEX_META).write_text(json.dumps(meta))
    ix = SenseIndex(str(moved))
    result = cluster_senses(ix, ["bank"], k=2, filters="year=2000..2010")
    assert {h.doc_id for h in result.occurrences} == _ids(year=2001) | _ids(year=2009)
    assert all(h.fields == {} for h in result.occurrences)
    with pytest.raises(ElmoUserError, match="cannot filter on 'speech-type': the index's "
                                            "dataset is not readable"):
        cluster_senses(ix, ["bank"], filters={"speech-type": "spoken"})


def test_the_last_bin_is_labelled_by_where_the_data_ends() -> None:
    from pipeline.lookup.senses.tables import bin_of, last_number

    # Data ending 2026 in bins of 5: "2025-2026", not "2025-2029" (no data after 2026).
    assert last_number([2003, None, "n/a", 2026, 2011]) == 2026
    assert bin_of(2026, 5, last=2026) == (2025, "2025-2026")
    assert bin_of(2021, 5, last=2026) == (2020, "2020-2024")  # earlier bins are whole
    assert bin_of(2025, 5, last=2025) == (2025, "2025")
    assert bin_of(2026, 5) == (2025, "2025-2029")  # without the end: the whole bin
