"""Loading weights: shape checks, clear one-line errors, safetensors round trip."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import elmo_model
from elmo_model import ElmoUserError


def _copy_fixture(fixture: Path, tmp_path: Path) -> tuple[Path, Path]:
    options, weights = tmp_path / "options.json", tmp_path / "weights.hdf5"
    shutil.copy(fixture / "options.json", options)
    shutil.copy(fixture / "lm_weights.hdf5", weights)
    return options, weights


def test_missing_files_name_the_path(tmp_path: Path, elmo_fixture_dir: Path) -> None:
    with pytest.raises(ElmoUserError, match="options file not found"):
        elmo_model.load(tmp_path / "nope.json", elmo_fixture_dir / "lm_weights.hdf5")
    with pytest.raises(ElmoUserError, match="weights file not found"):
        elmo_model.load(elmo_fixture_dir / "options.json", tmp_path / "nope.hdf5")
    with pytest.raises(ElmoUserError, match="model directory not found"):
        elmo_model.load_model_dir(tmp_path / "missing")


def test_truncated_hdf5_is_one_clear_error(tmp_path: Path, elmo_fixture_dir: Path) -> None:
    options, weights = _copy_fixture(elmo_fixture_dir, tmp_path)
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ElmoUserError, match=r"truncated or corrupt") as info:
        elmo_model.load(options, weights)
    assert "\n" not in str(info.value)


def test_options_that_disagree_with_weights_name_tensor_and_shapes(
    tmp_path: Path, elmo_fixture_dir: Path
) -> None:
    options, weights = _copy_fixture(elmo_fixture_dir, tmp_path)
    config = json.loads(options.read_text())
    config["lstm"]["dim"] = 128
    options.write_text(json.dumps(config))
    with pytest.raises(ElmoUserError) as info:
        elmo_model.load(options, weights)
    message = str(info.value)
    assert "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0" in message
    assert "(32, 256)" in message and "(32, 512)" in message


def test_missing_tensor_and_bad_options(tmp_path: Path, elmo_fixture_dir: Path) -> None:
    options, weights = _copy_fixture(elmo_fixture_dir, tmp_path)
    with h5py.File(weights, "a") as handle:
        del handle["CNN_proj/b_proj"]
    with pytest.raises(ElmoUserError, match="CNN_proj/b_proj is missing"):
        elmo_model.load(options, weights)
    options.write_text("{not json")
    with pytest.raises(ElmoUserError, match="not valid JSON"):
        elmo_model.load(options, weights)
    options.write_text(json.dumps({"lstm": {"dim": 4}, "char_cnn": {}}))
    with pytest.raises(ElmoUserError, match="missing key"):
        elmo_model.load(options, weights)


def test_every_foreign_tensor_shape_is_checked(tmp_path: Path, elmo_fixture_dir: Path) -> None:
    """Each tensor of the bilm-tf layout, and each of our safetensors, given one extra row
    is refused before anything is copied, naming the tensor."""
    from safetensors.torch import load_file, save_file

    from elmo_model.weights import _bilm_tf_tensors

    options, weights = _copy_fixture(elmo_fixture_dir, tmp_path)
    names = [name for name, _ in _bilm_tf_tensors(elmo_model.read_options(options))]
    with h5py.File(weights, "r") as handle:
        assert sorted(names) == sorted(  # the layout lists every tensor the file holds
            name for name, item in _datasets(handle))
    for name in names:
        broken = tmp_path / "broken.hdf5"
        shutil.copy(weights, broken)
        with h5py.File(broken, "a") as handle:
            value = handle[name][...]
            del handle[name]
            handle[name] = np.concatenate([value, value[:1]])
        with pytest.raises(ElmoUserError, match=f"tensor {name} has shape"):
            elmo_model.load(options, broken)
    model_dir = elmo_model.save_model_dir(elmo_model.build_model(options, weights),
                                          tmp_path / "ours")
    tensors = load_file(str(model_dir / "weights.safetensors"))
    for name in tensors:
        grown = dict(tensors)
        grown[name] = torch.cat([tensors[name], tensors[name][:1]])
        save_file(grown, str(model_dir / "weights.safetensors"))
        with pytest.raises(ElmoUserError, match=f"tensor {name} has shape"):
            elmo_model.load_model_dir(model_dir)


def _datasets(group: h5py.Group, prefix: str = ""):
    for key, item in group.items():
        if isinstance(item, h5py.Dataset):
            yield prefix + key, item
        else:
            yield from _datasets(item, f"{prefix}{key}/")


def test_unknown_weight_format_is_refused(tmp_path: Path, elmo_fixture_dir: Path) -> None:
    pickle_file = tmp_path / "weights.pt"
    pickle_file.write_bytes(b"\x80\x04")
    with pytest.raises(ElmoUserError, match="never loaded"):
        elmo_model.load(elmo_fixture_dir / "options.json", pickle_file)


def test_safetensors_round_trip_gives_identical_vectors(
    tmp_path: Path, elmo_fixture_dir: Path
) -> None:
    model = elmo_model.build_model(elmo_fixture_dir / "options.json",
                                   elmo_fixture_dir / "lm_weights.hdf5")
    model_dir = elmo_model.save_model_dir(model, tmp_path / "ours")
    sentence = [["Round", "trips", "keep", "every", "bit", "."]]
    original = elmo_model.load(elmo_fixture_dir / "options.json",
                               elmo_fixture_dir / "lm_weights.hdf5", device="cpu").embed(sentence)
    reloaded = elmo_model.load_model_dir(model_dir, device="cpu").embed(sentence)
    assert np.array_equal(original[0], reloaded[0])


def test_fingerprint_changes_with_weights(tmp_path: Path, elmo_fixture_dir: Path) -> None:
    options, weights = _copy_fixture(elmo_fixture_dir, tmp_path)
    before = elmo_model.model_fingerprint(options, weights)
    assert before == elmo_model.load(options, weights).fingerprint
    with h5py.File(weights, "a") as handle:
        handle["CNN_proj/b_proj"][0] += 1.0
    assert elmo_model.model_fingerprint(options, weights) != before


def test_tiny_random_model_loads_from_its_directory(tiny_model_dir: Path) -> None:
    embedder = elmo_model.load_model_dir(tiny_model_dir, device="cpu")
    layers = embedder.embed([["a", "b"], []])
    assert layers[0].shape == (3, 2, 16)
    assert layers[1].shape == (3, 0, 16)


def test_initial_state_auto_uses_a_shipped_warm_state(tiny_model_dir: Path, tmp_path: Path
                                                      ) -> None:
    shutil.copytree(tiny_model_dir, tmp_path / "m")
    assert elmo_model.load_model_dir(tmp_path / "m", device="cpu").initial_state == "zeros"
    model = elmo_model.build_model(tmp_path / "m" / "options.json",
                                   tmp_path / "m" / "weights.safetensors")
    elmo_model.save_warm_state(tmp_path / "m", elmo_model.compute_warm_state(model))
    auto = elmo_model.load_model_dir(tmp_path / "m", device="cpu")
    zeros = elmo_model.load_model_dir(tmp_path / "m", device="cpu", initial_state="zeros")
    assert auto.initial_state == "warm" and zeros.initial_state == "zeros"
    sentence = [["state", "matters"]]
    assert not np.allclose(auto.embed(sentence)[0][1], zeros.embed(sentence)[0][1])
    with pytest.raises(ElmoUserError, match="unknown initial_state"):
        elmo_model.load_model_dir(tmp_path / "m", initial_state="hot")


def test_load_takes_a_model_directory_like_the_cli(tmp_path: Path,
                                                   elmo_fixture_dir: Path) -> None:
    options, weights = _copy_fixture(elmo_fixture_dir, tmp_path)
    sentence = [["The", "bank", "raised", "rates", "."]]
    from_dir = elmo_model.load(tmp_path, device="cpu", initial_state="zeros").embed(sentence)
    from_files = elmo_model.load(options, weights, device="cpu",
                                 initial_state="zeros").embed(sentence)
    np.testing.assert_array_equal(from_dir[0], from_files[0])
    assert elmo_model.load(str(tmp_path), device="cpu").fingerprint == \
        elmo_model.load(options, weights, device="cpu").fingerprint


def test_load_names_the_fix_for_a_wrong_path(tmp_path: Path, elmo_fixture_dir: Path) -> None:
    options, weights = _copy_fixture(elmo_fixture_dir, tmp_path)
    with pytest.raises(ElmoUserError, match=r"model directory not found: .*missing"):
        elmo_model.load(tmp_path / "missing")
    with pytest.raises(ElmoUserError, match="is a file: pass its weights too"):
        elmo_model.load(options)
    with pytest.raises(ElmoUserError, match="takes no weights argument"):
        elmo_model.load(tmp_path, weights)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ElmoUserError, match=r"no options\.json in the model directory"):
        elmo_model.load(tmp_path / "empty")
