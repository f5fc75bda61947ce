"""The pure parts of the model evaluation scripts (bench/model_perplexity.py,
bench/layer_probe.py, bench/pos_probe.py, bench/sense_probe_senseval.py,
bench/demo_searches.py), checked against brute force."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]


def bench_module(name: str) -> ModuleType:
    if str(ROOT / "bench") not in sys.path:  # the scripts import each other, as when run
        sys.path.append(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_shared_log_prob_matches_brute_force_softmax() -> None:
    bench = bench_module("model_perplexity")
    words = ["<S>", "</S>", "<UNK>", "the", "cat", "sat", "mat"]
    shared = {"<S>", "</S>", "the", "sat"}  # "cat", "mat" and <UNK> are this model's own
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 3, size=(6, len(words)))
    # targets: a shared word, an own word, <UNK> (an unknown word), </S>, ...
    target_words = ["the", "cat", "zebra", "</S>", "mat", "sat"]
    target_ids = [words.index(w) if w in words else 2 for w in target_words]
    target_shared = [w in shared for w in target_words]
    outside = [w not in shared for w in words]

    got = bench.shared_log_prob(torch.tensor(logits), torch.tensor(target_ids),
                                torch.tensor(target_shared), torch.tensor(outside)).numpy()

    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    expected = [np.log(probs[i, target_ids[i]]) if target_shared[i]
                else np.log(probs[i, outside].sum()) for i in range(len(target_words))]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # the shared events (each shared word, one outside class) are a distribution
    shared_ids = [words.index(w) for w in sorted(shared)]
    total = probs[:, shared_ids].sum(axis=1) + probs[:, outside].sum(axis=1)
    np.testing.assert_allclose(total, 1.0, rtol=1e-6)


def test_bootstrap_interval_on_known_cases() -> None:
    bench = bench_module("layer_probe")
    constant = np.full(50, 0.8)
    draws = bench.bootstrap_draws(50, 200, seed=0)
    np.testing.assert_allclose(bench.bootstrap_interval(constant, draws), (0.8, 0.8, 0.8))

    # half right out of 400: the 95% interval is about 0.5 +- 1.96 * sqrt(0.25 / 400)
    coin = np.array([1.0, 0.0] * 200)
    mean, low, high = bench.bootstrap_interval(coin, bench.bootstrap_draws(400, 2000, seed=1))
    half_width = 1.96 * np.sqrt(0.25 / 400)
    assert mean == 0.5
    assert abs(low - (0.5 - half_width)) < 0.01 and abs(high - (0.5 + half_width)) < 0.01


def test_sense_groups_keep_synsets_with_a_neighbour_and_lemmas_with_a_choice() -> None:
    bench = bench_module("layer_probe")
    item = bench.Item
    items = [item(("a",), 0, "play", "v", "1v"), item(("b",), 0, "play", "v", "1v"),
             item(("c",), 0, "play", "v", "2v"), item(("d",), 0, "play", "v", "2v"),
             item(("e",), 0, "play", "v", "3v"),  # alone in its synset: no neighbour
             item(("f",), 0, "bank", "n", "4n"), item(("g",), 0, "bank", "n", "4n")]
    assert bench.sense_groups(items) == [[0, 1, 2, 3]]


def test_demo_hit_offsets_hold_for_a_sentence_cut_from_the_line() -> None:
    bench = bench_module("demo_searches")
    line = "He came in.  Then  he plays the lute. They play."
    sentence = "Then  he plays the lute."
    assert bench.line_offset(line, sentence, sentence.index("plays")) == line.index("plays")
    assert bench.line_offset(line, line, line.index("play.")) == line.index("play.")
    # a sentence whose stored spaces differ from the line's
    assert bench.line_offset(line, "Then he plays the lute.", 8) == line.index("plays")


CONLLU = """# sent_id = 1
# text = I don't know.
1\tI\tI\tPRON\tPRP\t_\t4\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_
4.1\tit\tit\tPRON\tPRP\t_\t_\t_\t_\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

# sent_id = 2
1\tYes\tyes\tINTJ\tUH\t_\t0\troot\t_\t_
"""


def test_conllu_words_skip_multiword_tokens_and_empty_nodes(tmp_path: Path) -> None:
    bench = bench_module("pos_probe")
    (tmp_path / "x.conllu").write_text(CONLLU)
    first, second = bench.read_conllu(tmp_path / "x.conllu")
    assert first.words == ("I", "do", "n't", "know", ".")
    assert first.tags == {"upos": ("PRON", "AUX", "PART", "VERB", "PUNCT"),
                          "xpos": ("PRP", "VBP", "RB", "VB", ".")}
    assert second.words == ("Yes",) and second.tags["upos"] == ("INTJ",)


def test_ptb_trees_give_their_leaves_without_traces(tmp_path: Path) -> None:
    bench = bench_module("pos_probe")
    (tmp_path / "wsj_0001.mrg").write_text(
        "( (S (NP-SBJ (NNP Mr.) (NNP Vinken) )\n  (VP (VBZ is) (NP (-NONE- *T*-1) ))\n"
        "  (. .) ))\n( (FRAG (NP (NN Yes) ) (. !) ))\n")
    first, second = bench.read_ptb(tmp_path / "wsj_0001.mrg")
    assert first.words == ("Mr.", "Vinken", "is", ".")
    assert first.tags == {"ptb": ("NNP", "NNP", "VBZ", ".")}
    assert second.words == ("Yes", "!") and second.tags == {"ptb": ("NN", ".")}


def test_sentence_bootstrap_resamples_whole_sentences() -> None:
    bench = bench_module("pos_probe")
    lengths = np.array([3, 1, 2])
    scores = {"layer1": np.array([1, 1, 0, 1, 0, 0.0]), "layer2": np.array([1, 0, 0, 1, 1, 0.0])}
    out = bench.sentence_bootstrap(scores, lengths, resamples=300, seed=4)
    assert out["layer1"][0] == 3 / 6 and out["layer2"][0] == 3 / 6
    # Brute force: each draw's accuracy is its sentences' correct tokens over their tokens.
    draws = bench.bootstrap_draws(3, 300, 4)
    correct = {"layer1": [2, 1, 0], "layer2": [1, 1, 1]}
    for name in ("layer1", "layer2"):
        means = [sum(correct[name][s] for s in d) / lengths[d].sum() for d in draws]
        np.testing.assert_allclose(out[name][1:], np.percentile(means, [2.5, 97.5]))
    diff = [(sum(correct["layer1"][s] - correct["layer2"][s] for s in d)) / lengths[d].sum()
            for d in draws]
    np.testing.assert_allclose(out["layer1 - layer2"], [0.0, *np.percentile(diff, [2.5, 97.5])],
                               atol=1e-12)


SENSEVAL = """<corpus lang="en"><lexelt item="line-n">
<instance id="a"><answer instance="a" senseid="cord"/><context>
 <wf pos="DT">the</wf> <head> <wf pos="NN">line</wf></head> <wf pos="VBD">broke</wf>
</context></instance>
<instance id="b"><answer instance="b" senseid="phone"/><answer instance="b" senseid="cord"/>
<context> <head> <wf pos="NN">line</wf></head> </context></instance>
<instance id="c"><answer instance="c" senseid="phone"/><context>
 <wf pos="PRP">he</wf> <wf pos="VBD">held</wf> <wf pos="DT">the</wf>
 <head> <wf pos="NN">line</wf></head>
</context></instance>
</lexelt></corpus>"""


def test_senseval_contexts_and_nearest_sense_mean(tmp_path: Path) -> None:
    bench = bench_module("sense_probe_senseval")
    (tmp_path / "line.pos").write_text(SENSEVAL)
    contexts = bench.read_senseval(tmp_path)
    # "b" has two answers: left out, as ambiguous
    assert [(c.words, c.position, c.sense) for c in contexts] == [
        (("the", "line", "broke"), 1, "cord"), (("he", "held", "the", "line"), 3, "phone")]
    # Two senses of one word, vectors in two layers; sense means against brute force.
    rng = np.random.default_rng(2)
    many = [bench.Context("line", ("line",), 0, s) for s in ["cord"] * 6 + ["phone"] * 6]
    vectors = rng.normal(size=(12, 2, 4))
    vectors[:6, 1] += [3, 0, 0, 0]  # layer 1 separates the senses
    vectors[6:, 1] += [0, 3, 0, 0]
    train, test = bench.split_halves(many, seed=0)
    assert len(train) == len(test) == 6
    assert sorted(many[i].sense for i in train) == ["cord"] * 3 + ["phone"] * 3
    scores = bench.sense_scores(vectors, many, train, test)
    for layer in (0, 1):
        unit = vectors[:, layer] / np.linalg.norm(vectors[:, layer], axis=1, keepdims=True)
        means = {s: unit[[i for i in train if many[i].sense == s]].mean(axis=0)
                 for s in ("cord", "phone")}
        want = [max(means, key=lambda s: unit[i] @ means[s] / np.linalg.norm(means[s]))
                == many[i].sense for i in test]
        np.testing.assert_array_equal(scores[f"layer{layer}, nearest sense mean"], want)
    assert scores["layer1, nearest sense mean"].mean() == 1.0
    np.testing.assert_array_equal(scores["most frequent sense"].sum(), 3)
