"""Our biLM against the outputs the original bilm-tf produced (tests/fixtures/elmo)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import elmo_model
from elmo_model.char_ids import token_char_ids
from elmo_model.lstm_steps import choose_step

# Every step that runs on this CPU: the reference recurrence, the in-place torch step, and
# the oneDNN one that ``auto`` picks (the fused one: ``test_fused_lstm.py``, interpreted).
CPU_STEPS = ["reference", "torch", "onednn"]


def _fixture_embedder(fixture: Path, mode: str, lstm_impl: str = "auto",
                      **options) -> elmo_model.ElmoEmbedder:
    return elmo_model.load(fixture / "options.json", fixture / "lm_weights.hdf5", mode=mode,
                           device="cpu", lstm_impl=lstm_impl, **options)


@pytest.mark.slow
@pytest.mark.parametrize("lstm_impl", CPU_STEPS)
def test_stateful_mode_reproduces_bilm_tf_top_layer(elmo_fixture_dir: Path,
                                                    lstm_impl: str) -> None:
    sentences = json.loads((elmo_fixture_dir / "sentences.json").read_text())
    embedder = _fixture_embedder(elmo_fixture_dir, "stateful", lstm_impl)
    assert embedder.lstm_step[0] == lstm_impl
    expected = [h5py.File(elmo_fixture_dir / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    checked = 0
    # As the fixture was made: batch i holds sentence i of each of the 3 lists, state carried.
    for i in range(len(sentences[0])):
        batch = [sentences[k][i].split() for k in range(3)]
        for k, layers in enumerate(embedder.embed(batch)):
            top = layers[-1]  # [n, 2P]: forward half then backward half
            got = np.stack([top[:, :16], top[:, 16:]])
            want = expected[k][str(i)][...]
            assert got.shape == want.shape
            assert np.allclose(got, want, atol=1e-6, rtol=1e-5), (i, k, np.abs(got - want).max())
            checked += 1
    assert checked == 30


def test_resetting_state_matches_only_the_first_batch(elmo_fixture_dir: Path) -> None:
    """The fixture's later batches depend on carried state: stateless differs there."""
    sentences = json.loads((elmo_fixture_dir / "sentences.json").read_text())
    embedder = _fixture_embedder(elmo_fixture_dir, "stateless")
    expected = h5py.File(elmo_fixture_dir / "lm_embeddings_0.hdf5", "r")
    for i, should_match in ((0, True), (1, False)):
        top = embedder.embed([sentences[0][i].split()])[0][-1]
        got = np.stack([top[:, :16], top[:, 16:]])
        assert np.allclose(got, expected[str(i)][...], atol=1e-6, rtol=1e-5) == should_match


@pytest.mark.parametrize("lstm_impl", CPU_STEPS)
def test_char_cnn_reproduces_token_embeddings(elmo_fixture_dir: Path, lstm_impl: str) -> None:
    vocab = (elmo_fixture_dir / "vocab_test.txt").read_text(encoding="utf-8").splitlines()
    model = elmo_model.build_model(elmo_fixture_dir / "options.json",
                                   elmo_fixture_dir / "lm_weights.hdf5")
    step = choose_step(lstm_impl, "cpu").step  # onednn runs the highway and projection too
    ids = torch.from_numpy(np.stack([token_char_ids(t) for t in vocab]))
    with torch.inference_mode():
        got = model.token_embedding(ids, step).numpy()
    want = h5py.File(elmo_fixture_dir / "elmo_token_embeddings.hdf5", "r")["embedding"][...]
    assert got.shape == want.shape == (458, 16)
    assert np.allclose(got, want, atol=1e-6, rtol=1e-5)


def test_layer_zero_is_the_token_vector_for_both_directions(elmo_fixture_dir: Path) -> None:
    embedder = _fixture_embedder(elmo_fixture_dir, "stateless")
    layers = embedder.embed([["The", "cat", "sat", "."]])[0]
    assert layers.shape == (3, 4, 32)
    assert np.array_equal(layers[0, :, :16], layers[0, :, 16:])


@pytest.mark.slow
@pytest.mark.parametrize("lstm_impl", CPU_STEPS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stateless_vectors_do_not_depend_on_batch(elmo_fixture_dir: Path, dtype: str,
                                                  lstm_impl: str) -> None:
    sentences = json.loads((elmo_fixture_dir / "sentences.json").read_text())
    target = sentences[1][3].split()
    alone = _fixture_embedder(elmo_fixture_dir, "stateless", lstm_impl).embed([target])[0]
    others = [s.split() for s in sentences[0]] + [s.split()[:3] for s in sentences[2]]
    embedder = _fixture_embedder(elmo_fixture_dir, "stateless", lstm_impl)
    embedder.embed(others)  # history must not matter
    batched = embedder.embed([*others[:7], target, *others[7:]])[7]
    # the CPU's own step in float32 gives the same bits in any batch (issue 50); the
    # others stay close (docs/dataset_format.md, "Same vectors whatever the batch")
    exact = dtype == "float32" and lstm_impl == "onednn"
    if dtype == "float32":
        assert np.array_equal(alone, batched) if exact else np.abs(alone - batched).max() <= 1e-5
    small_batches = _fixture_embedder(elmo_fixture_dir, "stateless", lstm_impl, dtype=dtype,
                                      max_batch_tokens=16)
    regrouped = small_batches.embed([others[0], target, others[-1]])[1]
    tolerance = 1e-5 if dtype == "float32" else 5e-2
    assert np.array_equal(alone, regrouped) if exact else (
        np.abs(alone - regrouped).max() <= tolerance)


def test_tensor_api_matches_embed(elmo_fixture_dir: Path) -> None:
    from elmo_model.char_ids import batch_char_ids

    sentences = [["A", "short", "one"], ["A", "somewhat", "longer", "sentence", "here", "."]]
    embedder = _fixture_embedder(elmo_fixture_dir, "stateless")
    with torch.inference_mode():
        output = embedder.model(torch.from_numpy(batch_char_ids(sentences)))
    assert output.layers.shape == (3, 2, 6, 32)
    assert output.mask.tolist() == [[True] * 3 + [False] * 3, [True] * 6]
    for row, layers in enumerate(embedder.embed(sentences)):
        n = len(sentences[row])
        assert np.abs(output.layers[:, row, :n].numpy() - layers).max() <= 1e-5
        assert not output.layers[:, row, n:].any()


def test_stateful_rows_continue_their_own_state(elmo_fixture_dir: Path) -> None:
    """Row r of a call continues row r of the previous call, whatever the other rows are."""
    first, second = ["The", "dog", "barked", "."], ["It", "was", "late", "."]
    solo = _fixture_embedder(elmo_fixture_dir, "stateful")
    solo.embed([first])
    want = solo.embed([second])[0]
    mixed = _fixture_embedder(elmo_fixture_dir, "stateful")
    mixed.embed([first, ["Something", "else", "entirely", "longer", "than", "that"]])
    got = mixed.embed([second, ["x"]])[0]
    assert np.abs(got - want).max() <= 1e-5


def test_bf16_stays_close_to_fp32(elmo_fixture_dir: Path) -> None:
    text = json.loads((elmo_fixture_dir / "sentences.json").read_text())
    sentences = [s.split() for s in text[0]]
    fp32 = _fixture_embedder(elmo_fixture_dir, "stateless").embed(sentences)
    bf16 = elmo_model.load(elmo_fixture_dir / "options.json", elmo_fixture_dir / "lm_weights.hdf5",
                           device="cpu", dtype="bfloat16").embed(sentences)
    for a, b in zip(fp32, bf16, strict=True):
        cosine = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert cosine.min() >= 0.99


def test_warm_state_changes_vectors_and_is_stored(elmo_fixture_dir: Path, tmp_path: Path) -> None:
    model = elmo_model.build_model(elmo_fixture_dir / "options.json",
                                   elmo_fixture_dir / "lm_weights.hdf5")
    state = elmo_model.compute_warm_state(model)
    path = elmo_model.save_warm_state(tmp_path, state)
    loaded = elmo_model.load_warm_state(path, model.config)
    for (h, c), (lh, lc) in zip(state, loaded, strict=True):
        assert torch.equal(h, lh) and torch.equal(c, lc)
    zeros = _fixture_embedder(elmo_fixture_dir, "stateless").embed([["Hello", "there"]])[0]
    warm = elmo_model.load(elmo_fixture_dir / "options.json", elmo_fixture_dir / "lm_weights.hdf5",
                           device="cpu", initial_state="warm", warm_state_path=path)
    warm_vectors = warm.embed([["Hello", "there"]])[0]
    assert np.array_equal(zeros[0], warm_vectors[0])  # the token layer has no state
    assert not np.allclose(zeros[1], warm_vectors[1])
    assert np.abs(warm.embed([["Hello", "there"]])[0] - warm_vectors).max() == 0


def test_autograd_path_matches_in_place_inference_path(elmo_fixture_dir: Path) -> None:
    """Training runs the out-of-place recurrence; inference the in-place ones."""
    from elmo_model.char_ids import batch_char_ids

    model = elmo_model.build_model(elmo_fixture_dir / "options.json",
                                   elmo_fixture_dir / "lm_weights.hdf5")
    ids = torch.from_numpy(batch_char_ids([["a", "b", "c", "d"], ["e", "f"], ["g"]]))
    with torch.inference_mode():
        fast = model(ids, step=choose_step("torch", "cpu").step).layers
    with torch.enable_grad():
        slow = model(ids).layers
        slow.sum().backward()  # the graph is intact
    assert torch.allclose(fast, slow.detach(), atol=1e-6)
    assert model.layers[0].recurrent_weight.grad is not None


def test_embedder_names_its_lstm_step(elmo_fixture_dir: Path) -> None:
    embedder = _fixture_embedder(elmo_fixture_dir, "stateless")
    step, reason = embedder.lstm_step
    assert step == "onednn" and "oneDNN" in reason  # auto on this CPU
    with pytest.raises(elmo_model.ElmoUserError, match="unknown lstm_impl"):
        elmo_model.ElmoEmbedder(embedder.model, device="cpu", lstm_impl="cudnn")


def test_load_passes_the_lstm_step_choice() -> None:
    import elmo_model
    from elmo_model.errors import ElmoUserError

    embedder = elmo_model.load(elmo_model.default_model_dir(), device="cpu", lstm_impl="reference")
    assert embedder.lstm_step[0] == "reference"
    with pytest.raises(ElmoUserError, match="lstm_impl"):
        elmo_model.load(elmo_model.default_model_dir(), device="cpu", lstm_impl="cudnn")
