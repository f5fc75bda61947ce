"""Helpers for the training tests (no tests here): a tiny biLM config and a toy corpus."""

from __future__ import annotations

import json
import random
from pathlib import Path

TINY_OPTIONS = {
    "lstm": {"n_layers": 2, "dim": 32, "projection_dim": 16, "cell_clip": 3, "proj_clip": 3,
             "use_skip_connections": True},
    "char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 8], [2, 8], [3, 16]], "n_highway": 1,
                 "n_characters": 262, "max_characters_per_token": 50, "activation": "relu"},
    "training": {"batch_size": 16, "unroll_steps": 10, "n_tokens_vocab": 40,
                 "n_negative_samples": 0, "dropout": 0.0, "lr": 0.015, "clip_norm": 1.0,
                 "warmup_steps": 1,
                 "heldout_percent": 10.0},
}

SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the bird"]
VERBS = ["sat on", "looked at", "ran to", "slept near"]
OBJECTS = ["the mat", "a tree", "the house", "the river", "a chair"]


def write_tiny_options(directory: Path, **training: object) -> Path:
    options = json.loads(json.dumps(TINY_OPTIONS))
    options["training"].update(training)
    path = directory / "tiny.json"
    path.write_text(json.dumps(options))
    return path


def write_toy_corpus(directory: Path, n_lines: int = 300, seed: int = 0) -> str:
    """A regular little language: a trainable LM drops far below uniform perplexity."""
    rng = random.Random(seed)
    lines = [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ."
             for _ in range(n_lines)]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "toy.txt").write_text("\n".join(lines) + "\n")
    return str(directory / "*.txt")
