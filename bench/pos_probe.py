"""Which biLM layer serves part of speech, on every token of a treebank with gold tags
(never in the training corpora, which exclude annotated text), with sentence-level bootstrap
95% intervals.

    # English Web Treebank (Universal Dependencies), CC BY-SA 4.0: its dev and test files
    git clone --depth 1 https://github.com/UniversalDependencies/UD_English-EWT /tmp/ewt
    PYTHONPATH=$PWD .venv/bin/python bench/pos_probe.py models/default --ud-dir /tmp/ewt \\
        --random-floor
    # NLTK's Penn Treebank sample (Wall Street Journal, 199 files; LDC, non-commercial use)
    unzip treebank.zip -d /tmp/nltk        # nltk_data: packages/corpora/treebank.zip
    PYTHONPATH=$PWD .venv/bin/python bench/pos_probe.py models/default \\
        --ptb-dir /tmp/nltk/treebank/combined

Each sentence's words are embedded as one sequence with the model's own start
(``initial_state`` auto), the way the ELMo paper's taggers read them. Per layer, a linear
probe (scikit-learn's ``LogisticRegression`` on standardised vectors) is trained on every
token of the training part and scored on every token of the test part. Baseline: each
word's most frequent tag in the training part (unseen words: the most frequent tag overall).

- UD (``--ud-dir``): trained on ``*-dev.conllu``, scored on ``*-test.conllu``; word forms
  from column 2 (multiword-token lines such as ``don't`` are skipped in favour of their
  words ``do`` ``n't``); the universal tags (UPOS, 17) and the treebank's own (XPOS: Penn
  Treebank tags for English).
- PTB (``--ptb-dir``, the ``.mrg`` parse files): the leaves of each tree, traces
  (``-NONE-``) left out, with their Penn Treebank tags (the paper's task); trained on the
  first 80% of the files in name order, scored on the rest.

Intervals: ``--resamples`` bootstrap resamples of the test *sentences* (a sentence's tokens
stay together, since their tags are not independent), the same resamples for every layer,
so ``layer 1 - layer 2`` is a paired difference.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from layer_probe import (
    bootstrap_draws,
    common_options,
    interval_table,
    load_embedder,
    model_runs,
)

PTB_LEAF = re.compile(r"\(([^\s()]+) ([^\s()]+)\)")  # (TAG word)
PTB_TRAIN_SHARE = 0.8


@dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    tags: dict[str, tuple[str, ...]]  # tag set name -> one tag per word


def read_conllu(path: Path) -> list[Sentence]:
    """The sentences of a CoNLL-U file: word forms and both tags (multiword-token ranges
    and empty nodes skipped)."""
    sentences: list[Sentence] = []
    words: list[tuple[str, str, str]] = []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if not line:
            if words:
                forms, upos, xpos = zip(*words, strict=True)
                sentences.append(Sentence(forms, {"upos": upos, "xpos": xpos}))
            words = []
        elif not line.startswith("#"):
            fields = line.split("\t")
            if fields[0].isdigit():  # not "3-4" (a multiword token) or "5.1" (empty node)
                words.append((fields[1], fields[3], fields[4]))
    return sentences


def read_ptb(path: Path) -> list[Sentence]:
    """The sentences of a Penn Treebank ``.mrg`` file: each top-level tree's leaves with
    their tags, traces and other empty elements (``-NONE-``) left out."""
    sentences, depth, tree = [], 0, []
    for char in path.read_text(encoding="latin-1"):
        if depth or char == "(":
            tree.append(char)
        depth += (char == "(") - (char == ")")
        if tree and depth == 0:
            leaves = [(w, t) for t, w in PTB_LEAF.findall("".join(tree)) if t != "-NONE-"]
            if leaves:
                words, tags = zip(*leaves, strict=True)
                sentences.append(Sentence(words, {"ptb": tags}))
            tree = []
    return sentences


def read_treebank(args: argparse.Namespace) -> tuple[str, list[Sentence], list[Sentence]]:
    """``(name, training sentences, test sentences)`` of the treebank the options name."""
    if args.ud_dir:
        ud = Path(args.ud_dir)
        (dev,), (test,) = sorted(ud.glob("*-dev.conllu")), sorted(ud.glob("*-test.conllu"))
        return f"{ud.name} ({dev.name} / {test.name})", read_conllu(dev), read_conllu(test)
    files = sorted(Path(args.ptb_dir).glob("*.mrg"))
    cut = round(len(files) * PTB_TRAIN_SHARE)
    return (f"Penn Treebank sample ({files[0].stem}..{files[cut - 1].stem} / "
            f"{files[cut].stem}..{files[-1].stem})",
            [s for f in files[:cut] for s in read_ptb(f)],
            [s for f in files[cut:] for s in read_ptb(f)])


def token_vectors(embedder, sentences: list[Sentence]) -> np.ndarray:
    """``[tokens, L + 1, 2P]``: every word of every sentence, in order, in every layer."""
    layers = embedder.embed([list(s.words) for s in sentences])
    return np.concatenate([np.transpose(np.asarray(layer), (1, 0, 2)) for layer in layers])


def probe_scores(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                 test_y: np.ndarray) -> np.ndarray:
    """0/1 per test token: a linear probe trained on ``train_x`` (one layer's vectors)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train_x)
    probe = LogisticRegression(max_iter=1000, C=0.1)
    probe.fit(scaler.transform(train_x), train_y)
    return (probe.predict(scaler.transform(test_x)) == test_y).astype(float)


def majority_scores(train_words: list[str], train_y: np.ndarray, test_words: list[str],
                    test_y: np.ndarray) -> np.ndarray:
    by_word: dict[str, Counter] = defaultdict(Counter)
    for word, tag in zip(train_words, train_y, strict=True):
        by_word[word.lower()][tag] += 1
    overall = Counter(train_y.tolist()).most_common(1)[0][0]
    guess = [by_word[w.lower()].most_common(1)[0][0] if w.lower() in by_word else overall
             for w in test_words]
    return (np.array(guess) == test_y).astype(float)


def sentence_bootstrap(scores: dict[str, np.ndarray], lengths: np.ndarray, resamples: int,
                       seed: int) -> dict[str, list[float]]:
    """Token accuracy and its 95% interval over resampled sentences, per row of
    ``scores``; plus the paired ``layer1 - layer2``."""
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    draws = bootstrap_draws(len(lengths), resamples, seed)
    tokens_drawn = lengths[draws].sum(axis=1)
    rows = dict(scores)
    rows["layer1 - layer2"] = scores["layer1"] - scores["layer2"]
    out = {}
    for name, values in rows.items():
        per_sentence = np.add.reduceat(values, bounds[:-1])  # correct tokens per sentence
        means = per_sentence[draws].sum(axis=1) / tokens_drawn
        low, high = np.percentile(means, [2.5, 97.5])
        out[name] = [float(values.sum() / lengths.sum()), float(low), float(high)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", nargs="+", help="one or more model directories")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ud-dir", help="a UD treebank folder with *-dev.conllu and "
                        "*-test.conllu")
    source.add_argument("--ptb-dir", help="a folder of Penn Treebank .mrg files")
    common_options(parser, "also score the first model's network with random weights")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    name, train_sents, test_sents = read_treebank(args)
    tag_sets = list(train_sents[0].tags)
    lengths = np.array([len(s.words) for s in test_sents])
    train_words = [w for s in train_sents for w in s.words]
    test_words = [w for s in test_sents for w in s.words]
    print(f"{name}: probe trained on {len(train_words):,} tokens, scored on "
          f"{len(test_words):,} tokens in {len(test_sents):,} sentences", flush=True)

    results: dict[str, dict] = {}
    for run, model_dir, random_weights in model_runs(args.model_dir, args.random_floor):
        embedder = load_embedder(model_dir, random_weights)
        train_x, test_x = token_vectors(embedder, train_sents), token_vectors(embedder, test_sents)
        results[run] = {}
        for tags in tag_sets:
            train_y = np.array([t for s in train_sents for t in s.tags[tags]])
            test_y = np.array([t for s in test_sents for t in s.tags[tags]])
            scores = {f"layer{k}": probe_scores(train_x[:, k], train_y, test_x[:, k], test_y)
                      for k in range(train_x.shape[1])}
            scores["majority tag per word"] = majority_scores(train_words, train_y,
                                                              test_words, test_y)
            results[run][tags] = sentence_bootstrap(scores, lengths, args.resamples,
                                                    args.seed)
        print(f"{run}: {time.perf_counter() - start:.0f}s", flush=True)
    for tags in tag_sets:
        print(f"\n{tags.upper()} tags, {name}: token accuracy [95% sentence-bootstrap "
              "interval]")
        print(interval_table({run: rows[tags] for run, rows in results.items()}))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
