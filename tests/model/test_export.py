"""Export to the bilm-tf / AllenNLP layout: loading the export gives the same outputs."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import elmo_model
from elmo_model.char_ids import batch_char_ids
from elmo_model.model import BiLM, BiLMConfig
from elmo_model.weights import export_bilm_tf_weights, load_bilm_tf_weights, save_model_dir
from pipeline.cli import main

SENTENCES = [["The", "bank", "of", "the", "river", "."], ["I", "cannot", "bear", "it", "!"]]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _random_model(seed: int = 0) -> BiLM:
    """Every parameter random (biases and the char-embedding mask row included) so a
    swapped gate block or transposed kernel cannot hide behind zeros."""
    torch.manual_seed(seed)
    config = BiLMConfig(n_layers=2, lstm_dim=24, projection_dim=8, char_embedding_dim=4,
                        filters=((1, 4), (2, 6), (3, 6)), n_highway=2)
    model = BiLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.3)
        model.char_cnn.char_embedding.weight[0] = 0  # the mask row is not stored by bilm-tf
    return model.eval()


def _layers(model: BiLM) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.from_numpy(batch_char_ids(SENTENCES))).layers


def test_export_then_load_gives_identical_outputs(tmp_path: Path) -> None:
    model = _random_model()
    export_bilm_tf_weights(model, tmp_path / "weights.hdf5")
    loaded = BiLM(model.config)
    load_bilm_tf_weights(loaded, tmp_path / "weights.hdf5")
    # equal up to float32 rounding: the forget-gate bias goes through -1 then +1 (TF's
    # layout keeps the forget bias out of the stored tensor)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=1e-6,
                                   msg=name)
    torch.testing.assert_close(_layers(loaded.eval()), _layers(model), rtol=0, atol=1e-6)


def test_bilm_tf_weights_survive_load_then_export(tmp_path: Path,
                                                  elmo_fixture_dir: Path) -> None:
    """The original bilm-tf file, loaded and exported again, comes back tensor for tensor."""
    original = elmo_fixture_dir / "lm_weights.hdf5"
    model = elmo_model.build_model(elmo_fixture_dir / "options.json", original)
    export_bilm_tf_weights(model, tmp_path / "again.hdf5")
    with h5py.File(original, "r") as a, h5py.File(tmp_path / "again.hdf5", "r") as b:
        names: list[str] = []
        b.visit(lambda name: names.append(name) if isinstance(b[name], h5py.Dataset) else None)
        assert names
        for name in names:
            np.testing.assert_allclose(b[name][...], a[name][...], rtol=0, atol=1e-6,
                                       err_msg=name)


def test_cli_export_of_a_model_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _random_model(1)
    source = save_model_dir(model, tmp_path / "ours")
    # training keys ride along in our options; bilm-tf's layout has no place for them
    options = json.loads((source / "options.json").read_text())
    options["training"] = {"batch_size": 8}
    (source / "options.json").write_text(json.dumps(options))
    assert main(["model", "export", str(source), "--format", "allennlp",
                 "--out", str(tmp_path / "allennlp")]) == 0
    assert "weights.hdf5" in capsys.readouterr().out
    exported = json.loads((tmp_path / "allennlp" / "options.json").read_text())
    assert "training" not in exported and exported["lstm"]["dim"] == 24
    again = elmo_model.build_model(tmp_path / "allennlp" / "options.json",
                                   tmp_path / "allennlp" / "weights.hdf5")
    torch.testing.assert_close(_layers(again), _layers(model), rtol=0, atol=1e-6)
    # through the embedder as well: the same vectors from both directories
    ours = elmo_model.load_model_dir(source, device="cpu").embed(SENTENCES)
    theirs = elmo_model.load_model_dir(tmp_path / "allennlp", device="cpu").embed(SENTENCES)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_cli_export_errors_are_one_line(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "export", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("elmo: error:") and "\n" not in err and "not found" in err
