"""The lookup layer on real datasets written by the pipeline: mixes, SQL, LanceDB, senses.

One small corpus (two senses of "bank") is embedded once per module with the real
bilm-tf fixture model (float16 storage, two shards); the tests read it back through
DuckDB, numpy and LanceDB files on disk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from elmo_model import layer_mix
from elmo_model.errors import ElmoUserError
from pipeline.lookup.layers.mixes import iter_mixed
from pipeline.lookup.layers.tokens import read_table
from pipeline.write.embed import EmbedConfig, ModelSpec, embed_corpus
from schemas.dataset import load_mixes, open_dataset, save_mix
from schemas.mix_specs import Mix, resolve_mix

MONEY = [
    "She deposited her salary at the bank on Monday morning.",
    "The bank approved the loan and opened a savings account.",
    "He asked the bank for a mortgage to buy the house.",
    "The bank charged a high interest rate on the credit card.",
    "My account was overdrawn, so the bank froze my money.",
    "The teller at the bank counted the cash and cheques.",
    "Investors withdrew their money when the bank collapsed.",
    "The central bank raised interest rates to fight inflation.",
]
RIVER = [
    "They sat on the grassy bank of the river and watched the water.",
    "The fisherman stood on the muddy bank casting his line into the stream.",
    "Flood water rose over the river bank and covered the fields.",
    "Willow trees grow along the bank where the river bends.",
    "The canoe drifted toward the far bank of the lake.",
    "Ducks nested in the reeds on the bank of the pond.",
    "We walked along the steep bank beside the flowing river.",
    "Otters slid down the wet bank into the cold river water.",
]
MORE = ["A new shard arrives later. It holds a bank and a river too."]
LAYERS = ["layer_0", "layer_1", "layer_2"]


def _model_copy(source_options: Path, source_weights: Path, folder: Path) -> Path:
    """A model directory with the standard file names (the fixture's weights file is
    ``lm_weights.hdf5``), so the dataset descriptor points at a loadable directory."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(source_options, folder / "options.json")
    shutil.copy(source_weights, folder / f"weights{source_weights.suffix}")
    return folder


def _embed(model_dir: Path, corpus: Path, out: Path, part: str = "main") -> None:
    cfg = EmbedConfig(sources=[str(corpus)], out=str(out),
                      model=ModelSpec.resolve(str(model_dir)), min_items=2, progress=False,
                      executor="local", part=part)
    embed_corpus(cfg)


@pytest.fixture(scope="module")
def fixture_model(elmo_fixture_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model_copy(elmo_fixture_dir / "options.json", elmo_fixture_dir / "lm_weights.hdf5",
                       tmp_path_factory.mktemp("fixture_model"))


@pytest.fixture(scope="module")
def dataset(fixture_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lookup")
    (root / "senses.txt").write_text("\n".join(MONEY + RIVER) + "\n")
    out = root / "ds"
    _embed(fixture_model, root / "senses.txt", out)
    return out


def stored_layers(dataset: Path) -> tuple[pa.Table, list[np.ndarray]]:
    """Every token row and its layers, read independently of pipeline.lookup.layers.mixes
    (sorted)."""
    table = read_table(str(dataset)).sort_by([("doc_id", "ascending"),
                                                       ("sent_idx", "ascending"),
                                                       ("tok_idx", "ascending")])
    # As stored: float16, or float32 dequantized from int8.
    layers = [np.stack(table[c].to_numpy(zero_copy_only=False)) for c in LAYERS]
    return table, layers


def mixed_sorted(dataset: Path, mix: str | Mix) -> np.ndarray:
    ds = open_dataset(str(dataset))
    resolved = ds.mix(mix)
    metas, vecs = [], []
    for meta, v in iter_mixed(ds, resolved):
        metas.append(meta)
        vecs.append(v)
    table = pa.Table.from_batches(metas)
    order = np.lexsort((table["tok_idx"].to_numpy(), table["sent_idx"].to_numpy(),
                        np.array(table["doc_id"].to_pylist())))
    return np.concatenate(vecs)[order]


# --------------------------------------------------------------------------- mixes


@pytest.mark.parametrize("name, scalars, gamma", [
    ("top", [-np.inf, -np.inf, 0.0], 1.0),
    ("average", [0.0, 0.0, 0.0], 1.0),
    ("layer:1", [-np.inf, 0.0, -np.inf], 1.0),
    ('{"weights": [0.2, 0.3, 0.5], "gamma": 0.7}', list(np.log([0.2, 0.3, 0.5])), 0.7),
])
def test_mix_equals_layer_mix_on_stored_layers(dataset: Path, name: str, scalars: list[float],
                                               gamma: float) -> None:
    _, layers = stored_layers(dataset)
    expected = layer_mix(layers, scalars, gamma=gamma)
    np.testing.assert_allclose(mixed_sorted(dataset, name), expected, rtol=1e-6, atol=1e-6)


def test_token_norm_mix_normalises_each_token(dataset: Path) -> None:
    _, layers = stored_layers(dataset)
    mix = Mix("tn", (0.5, 0.0, 0.5), gamma=2.0, token_norm=True)
    normed = []
    for layer in layers:
        x = layer.astype(np.float32)
        normed.append((x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-12))
    expected = layer_mix(normed, mix.scalars, gamma=2.0)
    np.testing.assert_allclose(mixed_sorted(dataset, mix), expected, rtol=1e-5, atol=1e-5)


def test_stored_mix_round_trip_and_unknown_mix(dataset: Path, tmp_path: Path) -> None:
    ds_copy = tmp_path / "ds"
    shutil.copytree(dataset, ds_copy)
    save_mix(str(ds_copy), Mix("mine", (1.0, 1.0, 2.0), gamma=0.5, info={"why": "test"}))
    data = json.loads((ds_copy / "_mixes.json").read_text())
    assert data["mixes"]["mine"]["weights"] == [0.25, 0.25, 0.5]
    mix = resolve_mix("mine", 3, load_mixes(str(ds_copy)))
    assert mix.gamma == 0.5 and mix.used_layers == [0, 1, 2]
    with pytest.raises(ElmoUserError, match="unknown mix 'nope'"):
        open_dataset(str(ds_copy)).mix("nope")
    with pytest.raises(ElmoUserError, match=r"layers 0\.\.2"):
        open_dataset(str(ds_copy)).mix("layer:7")
    with pytest.raises(ElmoUserError, match="bad mix name"):
        save_mix(str(ds_copy), Mix("top", (1.0, 0.0, 0.0)))


def test_mix_files_written_before_token_norm_still_load(dataset: Path, tmp_path: Path) -> None:
    """Mix files and index metadata used to call the per-token normalisation layer_norm."""
    from pipeline.lookup.index.meta import IndexMeta

    ds_copy = tmp_path / "ds"
    shutil.copytree(dataset, ds_copy)
    old = {"weights": [0.5, 0.0, 0.5], "gamma": 2.0, "layer_norm": True}
    (ds_copy / "_mixes.json").write_text(json.dumps(
        {"format": "elmo-store/mixes", "version": 1, "mixes": {"old": old}}))
    mix = load_mixes(str(ds_copy))["old"]
    assert mix == Mix("old", (0.5, 0.0, 0.5), gamma=2.0, token_norm=True)
    np.testing.assert_array_equal(mixed_sorted(ds_copy, "old"), mixed_sorted(ds_copy, mix))
    meta = IndexMeta(dataset=str(ds_copy), model_fingerprint="f", mix=old, mix_name="old",
                     dim=32)
    assert IndexMeta.from_json(meta.to_json()).the_mix().same_vectors(mix)
    save_mix(str(ds_copy), Mix("new", (1.0, 0.0, 0.0)))  # rewriting keeps the old one
    stored = json.loads((ds_copy / "_mixes.json").read_text())["mixes"]
    assert stored["old"]["token_norm"] is True and "layer_norm" not in stored["old"]
    with pytest.raises(ElmoUserError, match="give 'token_norm' only"):
        resolve_mix({"weights": [1, 0, 0], "token_norm": True, "layer_norm": True}, 3)


# --------------------------------------------------------------------------- SQL


def test_sql_views_and_functions(dataset: Path) -> None:
    from pipeline.lookup.sql import connect, materialize_mix

    table, _ = stored_layers(dataset)
    con = connect(str(dataset))
    try:
        n_tokens, n_shards = con.sql("SELECT count(*), count(DISTINCT shard) FROM tokens"
                                     ).fetchall()[0]
        assert n_tokens == table.num_rows and n_shards == 2
        assert con.sql("SELECT count(*) FROM sentences").fetchall()[0][0] == 16
        assert con.sql("SELECT count(*) FROM documents").fetchall()[0][0] == 16
        # The UDF mixes inside SQL exactly like the numpy reader.
        rows = con.sql("SELECT elmo_mix(layer_0, layer_1, layer_2, 'average') FROM tokens "
                       "ORDER BY doc_id, sent_idx, tok_idx").fetchall()
        np.testing.assert_allclose(np.array([r[0] for r in rows], np.float32),
                                   mixed_sorted(dataset, "average"), rtol=1e-6, atol=1e-6)
        # Parameters, elmo_vector and elmo_cosine: the first "bank" is most like itself.
        first = con.execute("SELECT doc_id, sent_idx, tok_idx FROM tokens WHERE token = $w "
                            "ORDER BY doc_id, tok_idx LIMIT 1", {"w": "bank"}).fetchall()[0]
        best = con.execute(
            "SELECT doc_id, sent_idx, tok_idx, elmo_cosine(elmo_mix(layer_0, layer_1, layer_2, "
            "'top'), elmo_vector($d, $s, $t, 'top')) AS sim FROM tokens ORDER BY sim DESC "
            "LIMIT 1", {"d": first[0], "s": first[1], "t": first[2]}).fetchall()[0]
        assert best[:3] == first and best[3] == pytest.approx(1.0, abs=1e-5)
        # A hostile parameter stays a value.
        assert con.execute("SELECT count(*) FROM tokens WHERE token = $w",
                           {"w": "x' OR '1'='1"}).fetchall()[0][0] == 0
        # Precomputed mix table == the UDF.
        name = materialize_mix(con, str(dataset), "top")
        got = np.array([r[0] for r in con.sql(
            f"SELECT vector FROM {name} ORDER BY doc_id, sent_idx, tok_idx").fetchall()])
        np.testing.assert_allclose(got, mixed_sorted(dataset, "top"), rtol=1e-6)
        assert con.sql(f"SELECT typeof(vector) FROM {name} LIMIT 1").fetchall()[0][0] \
            == "FLOAT[32]"
    finally:
        con.close()


# --------------------------------------------------------------------------- index


def _brute_force(vectors: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = unit @ (query / np.linalg.norm(query))
    return np.argsort(-sims, kind="stable")[:k], np.sort(sims)[::-1][:k]


def test_flat_index_returns_exact_neighbours_and_grows_incrementally(
        dataset: Path, fixture_model: Path, tmp_path: Path) -> None:
    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.index.sense_index import SenseIndex, token_filter

    ds_copy = tmp_path / "ds"
    shutil.copytree(dataset, ds_copy)
    out = tmp_path / "ix"
    summary = build_index(str(ds_copy), "top", str(out), kind="flat", compact=False)
    assert summary.added_files == 2 and summary.built == "flat"
    ix = SenseIndex(str(out))
    table, _ = stored_layers(ds_copy)
    vectors = mixed_sorted(ds_copy, "top")
    keys = list(zip(table["doc_id"].to_pylist(), table["sent_idx"].to_pylist(),
                    table["tok_idx"].to_pylist(), strict=True))
    tokens = [t.lower() for t in table["token"].to_pylist()]
    rng = np.random.default_rng(0)
    for q in rng.choice(len(vectors), 5, replace=False):
        want, want_sims = _brute_force(vectors, vectors[q], 10)
        got = ix.search(vectors[q], k=10)
        got_sims = 1 - np.array(got["_distance"].to_pylist())
        np.testing.assert_allclose(got_sims, want_sims, atol=1e-4)
        got_keys = list(zip(got["doc_id"].to_pylist(), got["sent_idx"].to_pylist(),
                            got["tok_idx"].to_pylist(), strict=True))
        assert got_keys[0] == keys[q]
        assert set(got_keys[:5]) == {keys[i] for i in want[:5]}
        # Prefiltered: the same as brute force over the rows of that word.
        same = np.array([i for i, t in enumerate(tokens) if t == "bank"])
        want_same, _ = _brute_force(vectors[same], vectors[q], 3)
        got_same = ix.search(vectors[q], k=3, words=["BANK"])
        assert [k[:3] for k in zip(got_same["doc_id"].to_pylist(),
                                   got_same["sent_idx"].to_pylist(),
                                   got_same["tok_idx"].to_pylist(), strict=True)] \
            == [keys[same[i]] for i in want_same]
    hit = ix.search(vectors[0], k=1).to_pylist()[0]
    assert hit["sentence"][hit["start"]:hit["end"]] == hit["token"]

    # A later part adds shards: only those are read, the rest stays.
    (tmp_path / "more.txt").write_text("\n".join(MORE) + "\n")
    _embed(fixture_model, tmp_path / "more.txt", ds_copy, part="more")
    again = build_index(str(ds_copy), "top", str(out), kind="flat", compact=False)
    assert again.skipped_files == 2 and again.added_files >= 1
    assert SenseIndex(str(out)).table.count_rows() == len(vectors) + again.added_rows
    with pytest.raises(ElmoUserError, match="holds mix 'top'"):
        build_index(str(ds_copy), "average", str(out))
    # A part that leaves the dataset leaves the index; refresh_index drops doc ids.
    shutil.rmtree(ds_copy / "_manifest" / "more")
    gone = build_index(str(ds_copy), "top", str(out))
    assert gone.removed_files == again.added_files
    assert SenseIndex(str(out)).table.count_rows() == len(vectors)
    from jobs.index_refresh import refresh_index

    refresh_index(str(ds_copy), mix="top", index_uri=str(out), remove_doc_ids=[keys[0][0]])
    n_first = sum(k[0] == keys[0][0] for k in keys)
    assert SenseIndex(str(out)).table.count_rows() == len(vectors) - n_first
    # The word counts that route filtered queries follow every change.
    ix = SenseIndex(str(out))
    for words in (["bank"], ["BANK", "river"], ["the"], ["no-such-word"]):
        assert ix.word_rows(words) == ix.table.count_rows(token_filter(words))


def test_refresh_index_adds_only_the_files_it_is_given(
        dataset: Path, fixture_model: Path, tmp_path: Path) -> None:
    from jobs.index_refresh import refresh_index
    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.index.sense_index import SenseIndex, token_filter

    ds_copy = tmp_path / "ds"
    shutil.copytree(dataset, ds_copy)
    out = str(tmp_path / "ix")
    build_index(str(ds_copy), "top", out, kind="flat", compact=False)
    n_main = SenseIndex(out).table.count_rows()
    for part, text in (("more", MORE[0]), ("extra", "The bank of the river is steep.")):
        (tmp_path / f"{part}.txt").write_text(text + "\n")
        _embed(fixture_model, tmp_path / f"{part}.txt", ds_copy, part=part)
    ds = open_dataset(str(ds_copy))
    more, extra = (ds.shard_files("tokens", parts=[p]) for p in ("more", "extra"))
    rows = {name: sum(pq.read_metadata(f.path).num_rows for f in files)
            for name, files in (("more", more), ("extra", extra))}

    summary = refresh_index(str(ds_copy), mix="top", index_uri=out,
                            add_files=[f.path for f in more])
    ix = SenseIndex(out)
    assert (summary.added_files, summary.added_rows) == (len(more), rows["more"])
    assert ix.table.count_rows() == n_main + rows["more"]
    assert ix.table.count_rows("part = 'extra'") == 0  # live, but not asked for
    assert {f.key for f in more} <= set(ix.meta.indexed)
    assert not {f.key for f in extra} & set(ix.meta.indexed)
    # The rows are the mix on read of exactly that file, stored as float16.
    got = ix.table.search().where("part = 'more'").select(
        ["sent_idx", "tok_idx", "vector"]).to_arrow()
    _, want = next(iter_mixed(ds, ds.mix("top"), columns=("tok_idx",),
                              files=[f.path for f in more]))
    order = np.lexsort((got["tok_idx"].to_numpy(), got["sent_idx"].to_numpy()))
    np.testing.assert_array_equal(
        np.array(got["vector"].to_pylist(), np.float32)[order], want.astype(np.float16))

    # URIs name files too; a file given again replaces its rows (never held twice).
    refresh_index(str(ds_copy), mix="top", index_uri=out,
                  add_files=[ds.uri_of(f.path) for f in [*extra, *more]])
    ix = SenseIndex(out)
    assert ix.table.count_rows() == n_main + rows["more"] + rows["extra"]
    assert ix.word_rows(["bank"]) == ix.table.count_rows(token_filter(["bank"]))
    with pytest.raises(ElmoUserError, match="is not a live token file"):
        refresh_index(str(ds_copy), mix="top", index_uri=out,
                      add_files=[str(tmp_path / "nope.parquet")])


@pytest.mark.slow
def test_hnsw_index_builds_finds_itself_and_takes_new_shards(
        dataset: Path, fixture_model: Path, tmp_path: Path) -> None:
    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.index.meta import SearchParams
    from pipeline.lookup.index.sense_index import SenseIndex

    ds_copy = tmp_path / "ds"
    shutil.copytree(dataset, ds_copy)
    build_index(str(ds_copy), "average", str(tmp_path / "ix"), kind="hnsw", compact=False)
    ix = SenseIndex(str(tmp_path / "ix"))
    assert ix.meta.built == "hnsw" and ix.meta.search.refine_factor == 5
    assert ix.meta.search_auto and ix.meta.search == SearchParams.for_rows(ix.meta.rows)
    vectors = mixed_sorted(ds_copy, "average")
    for q in (0, 50, 100):
        assert ix.search(vectors[q], k=1)["_distance"][0].as_py() < 1e-5
    # New shards go in through add + optimize (no retraining): they are found too.
    (tmp_path / "more.txt").write_text("\n".join(MORE) + "\n")
    _embed(fixture_model, tmp_path / "more.txt", ds_copy, part="more")
    summary = build_index(str(ds_copy), "average", str(tmp_path / "ix"), kind="hnsw", compact=False)
    assert summary.added_rows > 0 and summary.skipped_files == 2
    ix = SenseIndex(str(tmp_path / "ix"))
    assert ix.table.count_rows() == len(vectors) + summary.added_rows
    assert not any(i.num_unindexed_rows for i in ix.table.list_indices())
    new = read_table(str(ds_copy), filters=[("doc_id", "=", "more.txt:1")])
    layers = [np.stack(new[c].to_numpy(zero_copy_only=False)) for c in LAYERS]
    query = layer_mix(layers, [0.0, 0.0, 0.0])[3]
    hit = ix.search(query, k=1).to_pylist()[0]
    assert hit["doc_id"] == "more.txt:1" and hit["_distance"] < 1e-5
    # Search parameters given once stay pinned across later incremental builds.
    build_index(str(ds_copy), "average", str(tmp_path / "ix"), search=SearchParams(7, 60, None),
                compact=False)
    build_index(str(ds_copy), "average", str(tmp_path / "ix"))
    meta = SenseIndex(str(tmp_path / "ix")).meta
    assert not meta.search_auto and meta.search == SearchParams(7, 60, None)


def test_search_params_follow_index_size() -> None:
    from pipeline.lookup.index.meta import LARGE_INDEX_ROWS, SearchParams

    small, large = SearchParams.for_rows(100_000), SearchParams.for_rows(LARGE_INDEX_ROWS)
    assert (small.nprobes, small.ef, small.refine_factor) == (20, 150, 5)
    assert (large.nprobes, large.ef, large.refine_factor) == (10, 150, 5)


# --------------------------------------------------------------------------- senses


@pytest.mark.slow
def test_sense_search_finds_its_own_sentence_and_clusters(dataset: Path, tmp_path: Path) -> None:
    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.senses.clusters import cluster_senses
    from pipeline.lookup.senses.search import search_senses

    build_index(str(dataset), "top", str(tmp_path / "ix"))
    # A corpus sentence embedded at query time must find its own stored token first:
    # same model (found through the descriptor), same float16 rounding, same mix.
    hits = search_senses(str(tmp_path / "ix"), RIVER[1], "bank", k=3)
    assert hits[0].sentence == RIVER[1] and hits[0].similarity == pytest.approx(1.0, abs=1e-4)
    assert hits[0].highlighted() == RIVER[1].replace("bank", "[bank]", 1)
    assert all(h.token.lower() == "bank" for h in hits)
    result = cluster_senses(str(tmp_path / "ix"), ["bank"], k=2)
    assert len(result.clusters) == 2
    assert sum(c.size for c in result.clusters) == len(MONEY) + len(RIVER)
    assert result.points.shape == (16, 2) and set(result.labels.tolist()) == {0, 1}


KIND_SORT = [
    "What kind of house do they live in now ?",
    "She had never seen that kind of flower before .",
    "It was a strange kind of silence in the room .",
    "Every kind of food was laid upon the long table .",
    "He was not the kind of man to complain of anything .",
    "They spoke of some kind of trouble in the village .",
    "This kind of weather will ruin the whole harvest .",
    "There is no kind of excuse for such conduct as his .",
]
KIND_KINDLY = [
    "You are very kind to think of me so often .",
    "She was always kind to the poor children of the parish .",
    "Her aunt was kind and gentle with everyone in the house .",
    "He had a kind heart and a cheerful temper .",
    "They were so kind to us when we were ill last winter .",
    "Thank you for your kind letter and the news it brought .",
    "The old woman gave him a kind smile as he passed .",
    "Be kind to your sisters while I am away .",
]


def test_sense_ranking_with_a_trained_model(tmp_path: Path) -> None:
    """Same-sense occurrences of "kind" (a sort of / kindly) rank first under the top mix.

    Needs a trained model: the bilm-tf fixture model (16-d projections, trained on a toy
    corpus) does not separate senses (precision@5 0.56 vs 0.47 by chance on "bank",
    measured), so this uses the bundled ``models/default``. "kind" is used because both
    its senses are common in the default model's training text; the financial "bank"
    hardly occurs there.
    """
    import elmo_model
    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.senses.search import search_senses

    model = elmo_model.default_model_dir()
    corpus = tmp_path / "senses.txt"
    corpus.write_text("\n".join(KIND_SORT + KIND_KINDLY) + "\n")
    _embed(model, corpus, tmp_path / "ds")
    build_index(str(tmp_path / "ds"), "top", str(tmp_path / "ix"), kind="flat", compact=False)
    queries = {"sort": "I do not like that kind of music at all .",
               "kindly": "She has always been very kind to her mother ."}
    for sense, sentence in queries.items():
        hits = search_senses(str(tmp_path / "ix"), sentence, "kind", k=5)
        same = sum((h.sentence in KIND_SORT) == (sense == "sort") for h in hits)
        assert same >= 4, f"{sense}: {[h.sentence for h in hits]}"


# --------------------------------------------------------------------------- mix fit


@pytest.mark.slow
def test_mix_fit_stores_a_named_mix(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ds_copy = tmp_path / "ds"
    shutil.copytree(dataset, ds_copy)
    table, _ = stored_layers(ds_copy)
    tokens = table["token"].to_pylist()
    # A task the char-CNN layer can solve: capitalised / lowercase word / punctuation.
    labels = ["punct" if not t[0].isalnum() else "cap" if t[0].isupper() else "word"
              for t in tokens]
    pq.write_table(table.select(["doc_id", "sent_idx", "tok_idx"]).append_column(
        "label", pa.array(labels)), tmp_path / "labels.parquet")
    rc = run_cli(monkeypatch, ["mix", "fit", str(ds_copy), "--labels",
                               str(tmp_path / "labels.parquet"), "--name", "shape",
                               "--epochs", "150"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "layer 0" in out and "mix probe acc" in out and "█" in out
    mix = load_mixes(str(ds_copy))["shape"]
    assert sum(mix.weights) == pytest.approx(1.0) and mix.info["held_out_accuracy"] > 0.5
    # The stored mix is usable by name everywhere.
    assert mixed_sorted(ds_copy, "shape").shape == (table.num_rows, 32)


# --------------------------------------------------------------------------- CLI + bad input


def run_cli(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> int:
    from pipeline import cli

    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.lookup.cli",))
    return cli.main(argv)


def test_cli_sql_formats(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    q = "SELECT doc_id, tok_idx FROM tokens WHERE token = $w ORDER BY doc_id LIMIT 2"
    assert run_cli(monkeypatch, ["sql", str(dataset), q, "--param", "w=bank"]) == 0
    out = capsys.readouterr().out
    assert "doc_id" in out and "(2 rows)" in out
    assert run_cli(monkeypatch, ["sql", str(dataset), q, "--param", "w=bank",
                                 "--format", "json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and set(rows[0]) == {"doc_id", "tok_idx"}
    assert run_cli(monkeypatch, ["sql", str(dataset), q, "--param", "w=bank",
                                 "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "doc_id,tok_idx"
    out_file = tmp_path / "r.parquet"
    assert run_cli(monkeypatch, ["sql", str(dataset), q, "--param", "w=bank", "--format",
                                 "parquet", "--out", str(out_file)]) == 0
    assert pq.read_table(out_file).num_rows == 2


def test_cli_sql_precomputed_mix(dataset: Path, capsys: pytest.CaptureFixture,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """--mix top: table mix_top holds the top mix of every token; array functions on it."""
    q = ("SELECT t.doc_id, t.sent_idx, t.tok_idx, array_cosine_similarity(t.vector, "
         "(SELECT vector FROM mix_top ORDER BY doc_id, sent_idx, tok_idx LIMIT 1)) AS sim "
         "FROM mix_top t WHERE lower(t.token) = $w ORDER BY sim DESC, doc_id LIMIT 20")
    assert run_cli(monkeypatch, ["sql", str(dataset), "--mix", "top", "--mix", "layer:1", q,
                                 "--param", "w=bank", "--format", "json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == len(MONEY) + len(RIVER)
    vectors = mixed_sorted(dataset, "top")
    table, _ = stored_layers(dataset)
    keys = list(zip(table["doc_id"].to_pylist(), table["sent_idx"].to_pylist(),
                    table["tok_idx"].to_pylist(), strict=True))
    first = vectors[0] / np.linalg.norm(vectors[0])
    for row in rows:
        v = vectors[keys.index((row["doc_id"], row["sent_idx"], row["tok_idx"]))]
        assert row["sim"] == pytest.approx(float(v @ first / np.linalg.norm(v)), abs=1e-5)
    assert run_cli(monkeypatch, ["sql", str(dataset), "--mix", "layer:1",
                                 "SELECT count(*) AS n FROM mix_layer_1", "--format",
                                 "json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == len(vectors)


@pytest.mark.slow
def test_cli_index_and_senses(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    ix = str(tmp_path / "ix")
    assert run_cli(monkeypatch, ["index", "build", str(dataset), "--mix", "top",
                                 "--out", ix]) == 0
    assert run_cli(monkeypatch, ["senses", "search", RIVER[0], "--word", "bank", "-k", "2",
                                 "--index", ix]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "grassy [bank] of" in out[0]
    png, page = tmp_path / "senses.png", tmp_path / "senses.html"
    assert run_cli(monkeypatch, ["senses", "cluster", "bank", "--k", "auto", "--index", ix,
                                 "--plot", str(png), "--html", str(page)]) == 0
    captured = capsys.readouterr()
    assert "sense 1 (" in captured.out and png.read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {png}" in captured.err and f"wrote {page}" in captured.err


def _dataset_without_layers(dataset: Path, tmp_path: Path) -> Path:
    bare = tmp_path / "bare"
    shutil.copytree(dataset, bare)
    for f in bare.glob("tokens/shard=*/*.parquet"):
        t = pq.read_table(f)
        pq.write_table(t.drop_columns([c for c in t.column_names if c.startswith("layer_")]), f)
    return bare


@pytest.mark.slow
@pytest.mark.parametrize("case", ["unknown-mix-sql", "unknown-mix-index", "no-layers",
                                  "no-layers-sql",
                                  "word-not-in-sentence", "malformed-sql", "no-dataset",
                                  "no-index", "bad-labels", "bad-nprobes",
                                  "unknown-mix-sql-table", "map-folder-missing", "k-zero"])
def test_bad_input_is_one_clear_line(case: str, dataset: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ds = str(dataset)
    ix = tmp_path / "ix"
    if case == "word-not-in-sentence":
        from pipeline.lookup.index.build import build_index

        build_index(ds, "top", str(ix))
    bare = str(_dataset_without_layers(dataset, tmp_path)) if case.startswith("no-layers") \
        else ""
    argv, expected = {
        "unknown-mix-sql": (["sql", ds, "SELECT elmo_mix(layer_0, layer_1, layer_2, 'nope') "
                                        "FROM tokens"], "unknown mix 'nope'"),
        "unknown-mix-index": (["index", "build", ds, "--mix", "nope", "--out", str(ix)],
                              "unknown mix 'nope'"),
        "no-layers": (["index", "build", bare, "--out", str(ix)], "stores no layers"),
        # --no-verify: the files were rewritten behind the manifest's back, which the
        # default check would report first
        "no-layers-sql": (["sql", bare, "--no-verify",
                           "SELECT elmo_mix(layer_0, layer_1, layer_2, 'top') FROM tokens"],
                          "stores no layer columns"),
        "word-not-in-sentence": (["senses", "search", "He plays the guitar", "--word", "bank",
                                  "--index", str(ix)], "word 'bank' is not in the sentence"),
        "malformed-sql": (["sql", ds, "SELEC token FROM tokens"], "Parser Error"),
        "no-dataset": (["sql", str(tmp_path), "SELECT 1"], "not an elmo-store dataset"),
        "no-index": (["senses", "cluster", "bank", "--index", str(tmp_path / "none")],
                     "not an elmo sense index"),
        "bad-labels": (["mix", "fit", ds, "--labels", str(tmp_path / "missing.csv"),
                        "--name", "x"], "labels file not found"),
        "bad-nprobes": (["index", "build", ds, "--out", str(ix), "--nprobes", "0"],
                        "--nprobes must be at least 1"),
        "unknown-mix-sql-table": (["sql", ds, "--mix", "nope", "SELECT 1"],
                                  "unknown mix 'nope'"),
        "map-folder-missing": (["senses", "cluster", "bank", "--index", str(ix), "--html",
                                str(tmp_path / "no" / "bank.html")], "does not exist"),
        "k-zero": (["senses", "search", "a bank", "--word", "bank", "-k", "0", "--index",
                    str(ix)], "-k must be at least 1"),
    }[case]
    assert run_cli(monkeypatch, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("elmo: error:") and expected in err[0], err


# --------------------------------------------------------------------------- layout


LOOKUP_MODULES = ("layers.mixes", "layers.parquet", "layers.probe", "sql", "doc_fields",
                  "index.sense_index", "senses.search", "senses.maps", "serve.app", "cli")


def test_read_path_lives_in_pipeline_lookup() -> None:
    import importlib
    import importlib.util
    import subprocess
    import sys

    import pipeline.lookup
    from pipeline import cli

    package_dir = Path(pipeline.lookup.__file__).parent
    assert package_dir.name == "lookup" and package_dir.parent.name == "pipeline"
    for name in LOOKUP_MODULES:
        module = importlib.import_module(f"pipeline.lookup.{name}")
        part = name.split(".")[0]
        assert Path(module.__file__).parent == package_dir.joinpath(*name.split(".")[:-1])
        assert f"``{part}``" in pipeline.lookup.__doc__  # the package says what each holds
        assert importlib.util.find_spec(f"pipeline.{part}") is None or part == "cli"
    assert importlib.util.find_spec("pipeline.lookup_cli") is None
    assert "pipeline.lookup.cli" in cli.REGISTRARS
    # `elmo --help` stays fast: registering the lookup verbs imports nothing heavy.
    heavy = ("lancedb", "duckdb", "sklearn", "matplotlib", "plotly", "torch")
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, argparse, pipeline.lookup.cli as c; "
         "c.register(argparse.ArgumentParser().add_subparsers()); "
         f"print(' '.join(m for m in {heavy!r} if m in sys.modules))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []
