"""Sense search and sense maps on a real dataset and index: word forms, repeated contexts,
the dataset's tokenizer, older indexes, the PNG and HTML maps, and the demo.

A small corpus (forms of "play" in two senses, one line repeated in two documents) is
embedded once with the bilm-tf fixture model; LanceDB indexes are built on disk.
"""

from __future__ import annotations

import argparse
import html
import importlib
import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from elmo_model.errors import ElmoUserError
from pipeline.demo import DEMO_MARK
from pipeline.lookup.senses.clusters import ClusterResult
from pipeline.write.embed import EmbedConfig, ModelSpec, embed_corpus

MUSIC = [
    "She plays the piano every evening after supper.",
    "He played a sonata on the old violin.",
    "They were playing a duet on the harp and the flute.",
    "Mary will play the organ at church on Sunday.",
    "The band plays loud music in the square.",
]
THEATRE = [
    "We went to the theatre to see a new play by a young author.",
    "The play was a great success and ran for a year.",
    "The actors rehearsed the play until midnight.",
    "Her first play opened in London last winter.",
]
REPEATED = "The children played in the garden all afternoon."
CORPUS = MUSIC + THEATRE + [REPEATED, "A quiet line with no such word in it.", REPEATED]
PLAY_FORMS = {"play", "plays", "played", "playing"}


def _model_copy(fixture_dir: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(fixture_dir / "options.json", folder / "options.json")
    shutil.copy(fixture_dir / "lm_weights.hdf5", folder / "weights.hdf5")
    return folder


def _embed(model_dir: Path, corpus: Path, out: Path) -> None:
    embed_corpus(EmbedConfig(sources=[str(corpus)], out=str(out),
                             model=ModelSpec.resolve(str(model_dir)), min_items=2,
                             progress=False, executor="local"))


@pytest.fixture(scope="module")
def fixture_model(elmo_fixture_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model_copy(elmo_fixture_dir, tmp_path_factory.mktemp("senses_model"))


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("senses_corpus") / "play.txt"
    path.write_text("\n".join(CORPUS) + "\n")
    return path


@pytest.fixture(scope="module")
def dataset(fixture_model: Path, corpus_file: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("senses") / "ds"
    _embed(fixture_model, corpus_file, out)
    return out


@pytest.fixture(scope="module")
def index(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    from pipeline.lookup.index.build import build_index

    out = str(tmp_path_factory.mktemp("senses_ix") / "ix")
    build_index(str(dataset), "top", out, kind="flat", compact=False)
    return out


def _stem(word: str) -> str:
    import snowballstemmer

    return snowballstemmer.stemmer("english").stemWord(word.lower())


# --------------------------------------------------------------------------- search


def test_search_matches_the_words_forms_by_default(index: str) -> None:
    from pipeline.lookup.index.sense_index import SenseIndex, token_filter
    from pipeline.lookup.senses.search import search_senses

    ix = SenseIndex(index)
    forms_in_index = ix.table.count_rows(token_filter(sorted(PLAY_FORMS)))
    hits = search_senses(ix, MUSIC[0], "plays", k=50)
    # Every form, and only forms: the default answers "plays" with play/played/playing.
    assert {h.token.lower() for h in hits} == PLAY_FORMS
    assert len(hits) == forms_in_index - 1  # the repeated line's "played" counted once
    assert hits[0].sentence == MUSIC[0] and hits[0].similarity == pytest.approx(1.0, abs=1e-4)
    # --same-form: the word as written only; --any-word: every token.
    same = search_senses(ix, MUSIC[0], "plays", k=50, match="word")
    assert {h.token.lower() for h in same} == {"plays"} and len(same) == 2
    anything = search_senses(ix, MUSIC[0], "plays", k=forms_in_index + 5, match="any")
    assert len(anything) == forms_in_index + 5
    assert {h.token.lower() for h in anything} - PLAY_FORMS
    # The query word is found by its stem too: --word play in a sentence saying "plays".
    assert search_senses(ix, MUSIC[0], "play", k=1)[0].sentence == MUSIC[0]


def test_identical_contexts_are_listed_once(index: str) -> None:
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.senses.search import search_senses

    ix = SenseIndex(index)
    # The repeated line is stored twice (two documents) ...
    stored = ix.occurrences(["played"], columns=["doc_id", "sentence"]).to_pylist()
    assert sum(r["sentence"] == REPEATED for r in stored) == 2
    # ... and found once, still k results: the search fetched further to fill them.
    for match in ("forms", "any"):
        hits = search_senses(ix, REPEATED, "played", k=4, match=match)
        assert len(hits) == 4 and [h.rank for h in hits] == [1, 2, 3, 4]
        assert sum(h.sentence == REPEATED and h.token == "played" for h in hits) == 1
        assert len({h.context for h in hits}) == 4


def test_query_is_tokenized_with_the_datasets_tokenizer(dataset: Path, index: str,
                                                         tmp_path: Path) -> None:
    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.senses.search import dataset_tokenizer, locate_word, search_senses
    from pipeline.tokenize import get_tokenizer
    from schemas.dataset import read_dataset_descriptor

    descriptor = read_dataset_descriptor(str(dataset))
    assert dataset_tokenizer(descriptor).name == descriptor.tokenizer["name"]
    # Tokenizers split differently; the query must be split like the corpus was.
    ptb = locate_word("I don't play", "n't", tokenizer=get_tokenizer("elmo-store-ptb"))
    assert ptb.tokens[:3] == ["I", "do", "n't"]
    # A dataset recording a tokenizer this version does not know: one clear error.
    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    data = json.loads((copy / "_dataset.json").read_text())
    data["tokenizer"]["name"] = "no-such-tokenizer"
    (copy / "_dataset.json").write_text(json.dumps(data))
    build_index(str(copy), "top", str(tmp_path / "ix"), kind="flat", compact=False)
    with pytest.raises(ElmoUserError, match="tokenized with 'no-such-tokenizer'"):
        search_senses(str(tmp_path / "ix"), MUSIC[0], "plays")


def test_index_stores_stems_and_counts_them(index: str) -> None:
    from pipeline.lookup.index.sense_index import STEMMER, SenseIndex, token_filter

    ix = SenseIndex(index)
    assert ix.meta.stemmer == STEMMER
    rows = ix.table.search().select(["token_lower", "token_stem"]).limit(10_000) \
        .to_arrow().to_pylist()
    assert all(r["token_stem"] == _stem(r["token_lower"]) for r in rows)
    assert any(tuple(i.columns) == ("token_stem",) for i in ix.table.list_indices())
    for words in (["plays"], ["PLAYED", "theatre"], ["no-such-word"]):
        assert ix.word_rows(words, "token_stem") \
            == ix.table.count_rows(token_filter(words, "token_stem"))
    assert ix.word_rows(["plays"], "token_stem") == sum(
        r["token_lower"] in PLAY_FORMS for r in rows)


def test_index_built_before_stems_asks_for_a_rebuild_then_builds_again(
        dataset: Path, index: str, tmp_path: Path) -> None:
    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.index.sense_index import INDEX_META, STEMMER, SenseIndex
    from pipeline.lookup.senses.search import search_senses

    old = tmp_path / "old"
    shutil.copytree(index, old)
    # What older code wrote: no token_stem column, no stemmer in the metadata.
    SenseIndex(str(old)).table.drop_columns(["token_stem"])
    meta = json.loads((old / INDEX_META).read_text())
    del meta["stemmer"]
    (old / INDEX_META).write_text(json.dumps(meta))
    # An older storage generation: refused when opened, whatever the search.
    for match in ("forms", "word"):
        with pytest.raises(ElmoUserError, match=r"older layout .*without snowball-english "
                                                r"word stems.*elmo index build"):
            search_senses(str(old), MUSIC[0], "plays", match=match)
    lines: list[str] = []
    summary = build_index(str(dataset), "top", str(old), kind="flat", compact=False,
                          progress=lines.append)
    assert "rebuilding" in lines[0] and summary.added_files == 2
    rebuilt = SenseIndex(str(old))
    assert rebuilt.meta.stemmer == STEMMER and "token_stem" in rebuilt.table.schema.names
    assert len(search_senses(rebuilt, MUSIC[0], "plays", k=3)) == 3


# --------------------------------------------------------------------------- clusters + maps


@pytest.fixture(scope="module")
def clusters(index: str) -> ClusterResult:
    from pipeline.lookup.senses.clusters import cluster_senses

    return cluster_senses(index, ["play", "plays", "played", "playing"], k=2)


def test_clusters_hold_each_context_once_and_are_named(clusters: ClusterResult) -> None:
    n_forms = sum(sum(w.strip(".,").lower() in PLAY_FORMS for w in line.split())
                  for line in CORPUS)
    assert clusters.n_rows == n_forms and len(clusters.occurrences) == n_forms - 1
    assert clusters.n_distinct == n_forms - 1 and not clusters.auto
    assert len({h.context for h in clusters.occurrences}) == n_forms - 1
    assert [c.label for c in clusters.clusters] == [0, 1]
    assert [c.size for c in clusters.clusters] == sorted(
        np.bincount(clusters.labels).tolist(), reverse=True)
    for cluster in clusters.clusters:
        assert cluster.name().startswith(f"sense {cluster.label + 1} ({cluster.size}): ")
        assert cluster.examples and all(h.sentence for h in cluster.examples)
        # Typical phrases hold the word itself; typical words never name one of its forms.
        assert all(any(f in p.split() for f in PLAY_FORMS) for p in cluster.phrases)
        assert not set(cluster.keywords) & PLAY_FORMS
    assert clusters.points.shape == (n_forms - 1, 2) and sum(clusters.explained) <= 1.0


def test_clustering_samples_many_contexts_and_says_so(index: str) -> None:
    from pipeline.lookup.senses.clusters import AUTO_SILHOUETTE_SHARE, cluster_senses
    from pipeline.lookup.senses.maps import map_subtitle

    result = cluster_senses(index, sorted(PLAY_FORMS), k="auto", max_contexts=6)
    assert len(result.occurrences) == 6 and result.n_distinct == 10 and result.auto
    assert set(result.silhouettes) == {2, 3, 4, 5}
    # auto: the largest k whose silhouette is near the best (clusters.sense_kmeans)
    best = max(result.silhouettes.values())
    near = [k for k, s in result.silhouettes.items()
            if s >= best - AUTO_SILHOUETTE_SHARE * abs(best)]
    assert result.k == max(near)
    assert result.n_rows == 11
    assert "11 uses in 10 distinct contexts (1 repeat a sentence already seen: counted " \
        "once, in the tables per group, and drawn once); a random 6 of the 10 contexts " \
        "clustered and drawn" in map_subtitle(result)
    with pytest.raises(ElmoUserError, match="no-such-word: 0 distinct context"):
        cluster_senses(index, ["no-such-word"])


def test_context_features_name_neighbours_and_content_words() -> None:
    from pipeline.lookup.senses.clusters import context_features
    from pipeline.lookup.senses.hits import Hit

    def features(sentence: str, start: int) -> tuple[set[str], set[str]]:
        end = start + 4
        return context_features(Hit(1, 1.0, sentence[start:end], "a:1", 0, 0, sentence,
                                    start, end))

    text = "Hamlet said the play, which the actors rehearsed, was the thing."
    assert features(text, text.index("play")) == ({"the play"}, {"hamlet", "said", "actors",
                                                                 "rehearsed"})
    text = "Let them play. Play, sirs, play the music!"
    assert features(text, text.index("Play"))[0] == {"(start) play"}
    assert features(text, text.rindex("play"))[0] == {"play the"}
    assert features(text, text.index("play"))[0] == {"them play"}


def test_typical_features_favour_the_cluster() -> None:
    from pipeline.lookup.senses.clusters import typical

    features = [{"the play", "a"}, {"the play"}, {"to play"}, {"to play", "a"}]
    labels = np.array([0, 0, 1, 1])
    assert typical(features, labels, 0, least=2) == ["the play"]
    assert typical(features, labels, 1, least=1, n=1) == ["to play"]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_png_map_has_title_axes_and_a_legend_naming_each_sense(clusters: ClusterResult,
                                                                tmp_path: Path) -> None:
    from matplotlib.image import imread

    from pipeline.lookup.senses.maps import sense_map_figure, write_sense_map_png

    figure = sense_map_figure(clusters)
    axes = figure.axes[0]
    assert '"play"' in figure.get_suptitle() and "mix top" in figure.get_suptitle()
    assert "k=2" in figure.get_suptitle()
    assert axes.get_xlabel().startswith("principal component 1")
    assert axes.get_ylabel().startswith("principal component 2")
    legend = figure.legends[0]
    texts = [t.get_text() for t in legend.get_texts()]
    assert len(texts) == 2
    for cluster, text in zip(clusters.clusters, texts, strict=True):
        assert text.startswith(cluster.name()) and "e.g. " in text
        assert f"[{cluster.examples[0].token}]" in text
    path = write_sense_map_png(clusters, tmp_path / "play.png")
    width, height = _png_size(path.read_bytes())
    assert 800 <= width <= 3000 and 600 <= height <= 3000
    pixels = imread(path)
    assert pixels.shape[:2] == (height, width) and len(np.unique(pixels.reshape(
        -1, pixels.shape[-1]), axis=0)) > 20  # drawn on, not a blank canvas
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ElmoUserError, match="does not exist"):
        write_sense_map_png(clusters, tmp_path / "missing" / "play.png")


def test_maps_draw_any_text(tmp_path: Path) -> None:
    """Corpus text is text: dollars (matplotlib math), markup (HTML), one lone cluster."""
    from pipeline.lookup.senses.clusters import SenseCluster
    from pipeline.lookup.senses.hits import Hit
    from pipeline.lookup.senses.maps import (
        sense_map_figure,
        write_sense_map_html,
        write_sense_map_png,
    )

    sentence = "It cost $5 and $6 <b>to</b> play & win."
    hits = [Hit(1, 1.0, "play", f"a.txt:{i}", 0, 7, sentence, 28, 32) for i in range(3)]
    result = ClusterResult(["play"], 1, {}, [SenseCluster(0, 3, hits[:1], ["$5 play"], [])],
                           np.zeros(3, np.int64), np.eye(3)[:, :2], hits, (0.5, 0.3),
                           "top", n_rows=3, n_distinct=3)
    legend = [t.get_text() for t in sense_map_figure(result).legends[0].get_texts()]
    # "\$" is how matplotlib is told a dollar is a dollar, not the start of a formula.
    assert legend == ['sense 1 (3): "\\$5 play"\n    e.g. It cost \\$5 and \\$6 <b>to</b> '
                      '[play] & win.']
    assert _png_size(write_sense_map_png(result, tmp_path / "m.png").read_bytes())[0] > 0
    page = write_sense_map_html(result, tmp_path / "m.html").read_text()
    assert any("&lt;b&gt;to&lt;/b&gt; <b>play</b> &amp; win." in t for t in _hover_texts(page))


def _hover_texts(page: str) -> list[str]:
    """Every ``hovertext`` array in the plotly figure embedded in the page."""
    decoder, texts = json.JSONDecoder(), []
    for match in re.finditer(r'"hovertext":', page):
        value, _ = decoder.raw_decode(page, match.end())
        texts.extend(value)
    return texts


def _escaped(text: str) -> str:
    return html.escape(text, quote=False)  # quotes stay: plotly.js shows &quot; as typed


def test_html_map_shows_each_sentence_on_hover(clusters: ClusterResult,
                                                tmp_path: Path) -> None:
    from pipeline.lookup.senses.maps import write_sense_map_html

    path = write_sense_map_html(clusters, tmp_path / "play.html")
    page = path.read_text(encoding="utf-8")
    texts = _hover_texts(page)
    assert len(texts) == len(clusters.occurrences)
    for hit in clusters.occurrences:
        marked = _escaped(hit.sentence[:hit.start]) + "<b>" + _escaped(
            hit.sentence[hit.start:hit.end]) + "</b>" + _escaped(hit.sentence[hit.end:])
        assert any(marked in t.replace("<br>", " ") for t in texts), marked
    # One trace per sense, named as the CLI names it; plotly.js inside the file.
    names = [json.loads(f'"{m}"') for m in re.findall(r'"name":"((?:[^"\\]|\\.)*)"', page)]
    for cluster in clusters.clusters:
        assert _escaped(cluster.name()) in names
    assert not re.search(r"<script[^>]*\bsrc=", page) and len(page) > 1_000_000


def test_contexts_are_the_same_only_when_the_text_says_so() -> None:
    from pipeline.lookup.senses.hits import Hit, distinct_contexts

    def hit(doc: str, sentence: str, tok_idx: int = 1) -> Hit:
        return Hit(1, 1.0, "play", doc, 0, tok_idx, sentence, 0, 0)

    hits = [hit("a:1", "We  play\nhere."), hit("b:7", "We play here."),  # one context
            hit("c:2", "We play here.", tok_idx=2),  # another token of the same text
            hit("d:1", ""), hit("d:2", "")]  # no sentence text: each its own context
    assert distinct_contexts(hits) == [0, 2, 3, 4]


def test_hover_text_escapes_markup() -> None:
    from pipeline.lookup.senses.hits import Hit
    from pipeline.lookup.senses.maps import hover_text

    sentence = 'Tom & <Jerry> play "tricks".'
    hit = Hit(1, 1.0, "play", "a.txt:1", 0, 3, sentence, 14, 18)
    assert hover_text(hit).endswith('Tom &amp; &lt;Jerry&gt; <b>play</b> "tricks".')


# --------------------------------------------------------------------------- CLI and demo


def run_cli(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> int:
    from pipeline import cli

    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.lookup.cli", "pipeline.demo"))
    return cli.main(argv)


@pytest.mark.slow
def test_cli_search_default_forms_and_any_word(index: str, capsys: pytest.CaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_cli(monkeypatch, ["senses", "search", MUSIC[0], "--word", "plays", "-k", "20",
                                 "--index", index]) == 0
    words = re.findall(r"\[(\w+)\]", capsys.readouterr().out)
    assert set(w.lower() for w in words) == PLAY_FORMS
    assert run_cli(monkeypatch, ["senses", "search", MUSIC[0], "--word", "plays", "-k", "20",
                                 "--index", index, "--any-word"]) == 0
    words = re.findall(r"\[(\w+)\]", capsys.readouterr().out)
    assert len(words) == 20 and set(w.lower() for w in words) - PLAY_FORMS
    with pytest.raises(SystemExit) as exit_:  # argparse: the two are exclusive
        run_cli(monkeypatch, ["senses", "search", MUSIC[0], "--word", "plays",
                              "--index", index, "--any-word", "--same-form"])
    assert exit_.value.code == 2 and "not allowed with" in capsys.readouterr().err


VERBS = [["sql"], ["index"], ["index", "build"], ["index", "info"], ["senses"],
         ["senses", "search"], ["senses", "cluster"], ["mix"], ["mix", "list"], ["mix", "fit"],
         ["demo"]]


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_help_teaches_each_verb(verb: list[str], capsys: pytest.CaptureFixture,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as exit_:
        run_cli(monkeypatch, [*verb, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and ":class:" not in text  # no raw reStructuredText
    description = text.split("\n\n")[1]
    assert len(description.split()) >= 3
    examples = text.split("examples:\n", 1)[1]
    assert f"elmo {' '.join(verb)} " in examples
    # Every argument says what it is for; no verb mentions an option it does not take.
    parser = _subparser(verb)
    verbs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in parser._actions:
        if action in verbs:
            assert all(sub.help for sub in action._choices_actions)
        else:
            assert action.help, f"`elmo {' '.join(verb)}`: {action.option_strings}"
    taken = {o for action in parser._actions for o in action.option_strings}
    for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", text.split("examples:")[0]):
        assert verbs or option in taken, f"`elmo {' '.join(verb)} --help` mentions {option}"


def _subparser(verb: list[str]) -> argparse.ArgumentParser:
    from pipeline import cli

    parser = argparse.ArgumentParser()
    names = cli.REGISTRARS
    sub = parser.add_subparsers()
    for name in names:
        if name in ("pipeline.lookup.cli", "pipeline.demo"):
            importlib.import_module(name).register(sub)
    for word in verb:
        parser = next(a for a in parser._actions
                      if isinstance(a, argparse._SubParsersAction)).choices[word]
    return parser


@pytest.mark.slow
def test_demo_writes_both_sense_maps_and_says_where(fixture_model: Path, corpus_file: Path,
                                                    tmp_path: Path,
                                                    capsys: pytest.CaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import cli

    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.embed_cli", "pipeline.lookup.cli",
                                            "pipeline.demo"))
    out = tmp_path / "demo"
    assert cli.main(["demo", "--out", str(out), "--corpus", str(corpus_file),
                     "--model", str(fixture_model)]) == 0
    printed = capsys.readouterr().out
    png, page = out / "play.png", out / "play.html"
    assert _png_size(png.read_bytes())[0] > 0 and _hover_texts(page.read_text())
    assert f"sense map {png}" in printed and f"sense map {page}" in printed
    assert "$ elmo senses cluster play" in printed and "--same-word" not in printed

    # Another model (a pulled models/default): the demo makes its own folder again, where
    # `elmo embed` alone refuses to mix two models in one dataset.
    other = Path(shutil.copytree(fixture_model, tmp_path / "other_model"))
    options = json.loads((other / "options.json").read_text())
    (other / "options.json").write_text(json.dumps({**options, "note": "another model"}))
    assert cli.main(["demo", "--out", str(out), "--corpus", str(corpus_file),
                     "--model", str(other)]) == 0
    assert "made with another model: making its dataset and index again" in \
        capsys.readouterr().out
    # A folder the demo did not make keeps its data: the embed step refuses, as it would.
    (out / DEMO_MARK).unlink()
    assert cli.main(["demo", "--out", str(out), "--corpus", str(corpus_file),
                     "--model", str(fixture_model)]) == 2
    assert "demo step 1 failed" in capsys.readouterr().err
    assert (out / "dataset" / "_dataset.json").is_file()


def test_cli_search_on_ray_refuses_before_ray_starts(index: str, capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``--ray-actors`` alone, and a full (not compact) index: one line naming the fix,
    before a Ray starts (test_index_ray searches on a Ray cluster)."""
    argv = ["senses", "search", MUSIC[0], "--word", "plays", "--index", index]
    assert run_cli(monkeypatch, [*argv, "--ray-actors", "2"]) != 0
    assert "--ray-actors needs --ray-address" in capsys.readouterr().err
    assert run_cli(monkeypatch, [*argv, "--ray-address", "local"]) != 0
    err = capsys.readouterr().err
    assert "not a compact index in shards" in err and "--rebuild" in err
    assert "Traceback" not in err


def _separated_senses(sizes: tuple[int, ...], dim: int = 64, noise: float = 0.05,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors around ``len(sizes)`` random directions (one sense each), and the
    sense of each."""
    rng = np.random.default_rng(seed)
    directions = np.linalg.qr(rng.normal(size=(dim, len(sizes))))[0].T
    truth = np.repeat(np.arange(len(sizes)), sizes)
    x = directions[truth] + noise * rng.normal(size=(len(truth), dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True), truth


@pytest.mark.parametrize("sizes", [(60, 20), (40, 25, 15), (30, 25, 20, 15, 10)])
def test_auto_k_finds_clearly_separated_senses(sizes: tuple[int, ...]) -> None:
    from sklearn.metrics import adjusted_rand_score

    from pipeline.lookup.senses.change_scores import sense_labels
    from pipeline.lookup.senses.clusters import sense_kmeans

    x, truth = _separated_senses(sizes)
    split = sense_kmeans(x, "auto")
    assert split.k == len(sizes) and adjusted_rand_score(truth, split.labels) == 1.0
    assert set(split.scores) == set(range(2, 9))  # every k of 2..8 was scored
    # senses change's jsd clusters its sampled uses with the same function.
    labels = sense_labels(x, np.random.default_rng(0))
    assert adjusted_rand_score(truth, labels) == 1.0
    # A fixed k is taken as given.
    assert sense_kmeans(x, 2).k == 2


def test_auto_k_keeps_senses_whole_across_sentence_positions() -> None:
    """Two senses, and a smaller shift shared by the uses that open a sentence (what the
    forward LSTM sees no left context for): auto keeps the two senses and does not split
    them again by position, though a larger k is allowed near the best silhouette."""
    from sklearn.metrics import adjusted_rand_score

    from pipeline.lookup.senses.clusters import sense_kmeans

    rng = np.random.default_rng(0)
    dim, n = 64, 200
    sense = rng.integers(0, 2, n)
    first = rng.random(n) < 0.3  # first word of its sentence
    base = rng.normal(size=dim)
    sense_axis, position_axis = np.linalg.qr(rng.normal(size=(dim, 2)))[0].T
    x = (base / np.linalg.norm(base) + 0.5 * np.where(sense, 1, -1)[:, None] * sense_axis
         + 0.5 * first[:, None] * position_axis + 0.06 * rng.normal(size=(n, dim)))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    split = sense_kmeans(x, "auto")
    assert split.k == 2 and adjusted_rand_score(sense, split.labels) == 1.0
    assert abs(adjusted_rand_score(first, split.labels)) < 0.05
