"""``elmo model info``, ``elmo embed-sentences`` and ``elmo train`` from the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, write_tiny_options, write_toy_corpus

from elmo_model.weights import read_options
from pipeline.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _files(model_dir: Path) -> list[str]:
    return [str(model_dir / "options.json"), str(model_dir / "weights.safetensors")]


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("elmo: error:"), err
    assert "\n" not in err and "Traceback" not in err
    return err


def test_model_info(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "info", *_files(tiny_model_dir)]) == 0
    out = capsys.readouterr().out
    config = read_options(tiny_model_dir / "options.json")
    assert f"{config.forward_flops_per_token():,}" in out
    assert "2 biLSTM layers, 32 cells, projection 8" in out
    assert "parameters:" in out


def test_embed_sentences_prints_shapes_and_saves_layers(
        tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "sentences.txt"
    text.write_text("The bank of the river .\n\nI cannot bear it !\n")
    assert main(["embed-sentences", *_files(tiny_model_dir), str(text)]) == 0
    captured = capsys.readouterr()
    assert "layers [3, 6, 16]" in captured.out and "layers [3, 5, 16]" in captured.out
    assert "2 sentences, 11 tokens, stateless" in captured.err
    out = tmp_path / "layers.npz"
    assert main(["embed-sentences", *_files(tiny_model_dir), str(text), "--out", str(out),
                 "--mode", "stateful"]) == 0
    saved = np.load(out)
    assert saved["sentence_0"].shape == (3, 6, 16) and saved["sentence_1"].shape == (3, 5, 16)


def test_missing_files_are_one_clear_line(tiny_model_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["embed-sentences", *_files(tiny_model_dir), str(tmp_path / "none.txt")]) == 2
    assert "sentence file not found" in _one_line_error(capsys)
    assert main(["model", "info", str(tmp_path / "no.json"), str(tmp_path / "no.hdf5")]) == 2
    assert "options file not found" in _one_line_error(capsys)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert main(["embed-sentences", *_files(tiny_model_dir), str(empty)]) == 2
    assert "no sentences" in _one_line_error(capsys)


def test_train_verb_and_its_mistakes(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    corpus = write_toy_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path)
    out = tmp_path / "run"
    assert main(["train", corpus, "--config", str(options), "--out", str(out), "--max-steps",
                 "3", "--no-progress", "--set", "dropout=0.2"]) == 0
    assert "step 3, held-out perplexity" in capsys.readouterr().out
    assert read_options(out / "options.json").extra["training"]["dropout"] == 0.2
    assert main(["model", "info", str(out / "options.json"),
                 str(out / "weights.safetensors")]) == 0
    capsys.readouterr()
    assert main(["train", corpus, "--config", "huge", "--out", str(tmp_path / "x")]) == 2
    assert "neither a preset" in _one_line_error(capsys)
    assert main(["train", str(tmp_path / "nothing*.txt"), "--out", str(tmp_path / "y")]) == 2
    assert "no files match" in _one_line_error(capsys)
    assert main(["train", corpus, "--out", str(tmp_path / "z"), "--set", "lr"]) == 2
    assert "KEY=VALUE" in _one_line_error(capsys)


def test_help_has_examples() -> None:
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "train", "--help"],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0
    assert "examples:" in result.stdout and "--init-from" in result.stdout


def test_model_verbs_take_a_model_directory(tiny_model_dir: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "info", str(tiny_model_dir)]) == 0
    by_dir = capsys.readouterr().out
    assert main(["model", "info", *_files(tiny_model_dir)]) == 0
    assert capsys.readouterr().out == by_dir
    text = tmp_path / "sentences.txt"
    text.write_text("The bank of the river .\n")
    assert main(["embed-sentences", str(tiny_model_dir), str(text)]) == 0
    assert "layers [3, 6, 16]" in capsys.readouterr().out


def test_wrong_model_paths_name_the_fix(tiny_model_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    options, weights = _files(tiny_model_dir)
    assert main(["model", "info", str(tmp_path / "nowhere")]) == 2
    assert "model directory not found" in _one_line_error(capsys)
    assert main(["model", "info", options]) == 2
    assert "give its weights file after it" in _one_line_error(capsys)
    assert main(["model", "info", str(tiny_model_dir), weights]) == 2
    assert "give the directory alone" in _one_line_error(capsys)
    assert main(["embed-sentences", str(tiny_model_dir)]) == 2
    assert "MODEL_DIR FILE or OPTIONS WEIGHTS FILE" in _one_line_error(capsys)
    (tmp_path / "empty_model").mkdir()
    assert main(["model", "info", str(tmp_path / "empty_model")]) == 2
    assert "no options.json" in _one_line_error(capsys)
