"""The pure parts of the model evaluation scripts (bench/model_perplexity.py,
bench/layer_probe.py, bench/demo_searches.py), checked against brute force."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]


def bench_module(name: str) -> ModuleType:
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
